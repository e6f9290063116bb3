//! The Wing–Gong / Lowe linearizability search, with Porcupine's memo.
//!
//! Calls and returns of the operations with a definite outcome are entries
//! of one list in real-time order. The search walks the list from its head:
//! at a call it tries to linearize that operation now (the model must
//! accept it, and the memo must not know the resulting state), lifting its
//! call and return out of the list and starting again from the head; at a
//! return it has met an operation that must already have taken effect, so
//! it undoes its last choice and tries the next one. The history is
//! linearizable when the list is empty.
//!
//! Operations of unknown outcome may take effect at any time after their
//! call, or never. They are not in the list: the search applies one only
//! just before a definite operation that cannot take effect without it
//! (and only those the [`Model`] names as able to help), first trying to
//! do without. Any linearization can be rearranged into that form: an
//! unknown operation followed by one that does not need it can move past
//! it or be dropped without changing any result.
//!
//! An operation marked `skippable` may also be linearized as a no-op (left
//! out): after its effect has been tried and undone, the search tries it
//! once more without effect, at the same place.
//!
//! The memo: per (definite operations linearized, model state), the sets of
//! unknown operations applied on the way. A state reached with a superset
//! of one of them is no better (the unknown operations not applied yet can
//! still be applied later, or never), so it is not explored again. With no
//! unknown operations this is Porcupine's memo of (linearized set, state).

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash};

/// The sequential specification the search checks against.
pub(crate) trait Model {
    /// The object's state: small and cheap to copy.
    type State: Copy + Eq + Hash;
    /// An operation with its results, as the model checks it.
    type Step;

    /// The state after `step` takes effect in `state`, or `None` if `step`
    /// could not have returned what it returned.
    fn step(&self, state: Self::State, step: &Self::Step) -> Option<Self::State>;

    /// Which of the `available` unknown operations (index, step) are worth
    /// applying just before `blocked`, which cannot take effect in `state`.
    /// Must keep every operation that can start a chain of unknown
    /// operations after which `blocked` takes effect; by default, all.
    fn enablers(
        &self,
        state: Self::State,
        blocked: &Self::Step,
        available: &[(usize, &Self::Step)],
    ) -> Vec<usize> {
        let _ = (state, blocked);
        available.iter().map(|(i, _)| *i).collect()
    }
}

/// An operation as the search sees it.
#[derive(Debug, Clone)]
pub(crate) struct SearchOp<T> {
    /// Rank of the invocation in real-time order (distinct across the
    /// history, lower than `ret`).
    pub call: usize,
    /// Rank of the definite return; `None`: may take effect at any time
    /// after the call, or never (unknown outcome).
    pub ret: Option<usize>,
    /// May be left out even though it has a definite return: it is known
    /// to have taken effect, but possibly at a point outside the history
    /// searched (the start of a window cut out of a longer history). The
    /// search tries it with its effect first, then as a no-op.
    pub skippable: bool,
    /// What the model is given.
    pub step: T,
}

/// How a search ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SearchResult {
    /// A linearization exists.
    Linearizable,
    /// None exists. `deepest`: the most operations linearized at once;
    /// `blocked`: the operation (index into the input) that had to take
    /// effect next, but could not, when the search was deepest.
    NotLinearizable { deepest: usize, blocked: usize },
    /// The step budget ran out first.
    Exhausted,
}

const NIL: usize = usize::MAX;

/// The list of call and return entries of the definite operations, as a
/// doubly linked list over arrays, with a sentinel head, so that lifting an
/// operation out and putting it back (in reverse order) are O(1).
struct Entries {
    op: Vec<usize>,
    is_call: Vec<bool>,
    next: Vec<usize>,
    prev: Vec<usize>,
    /// Entry of each operation's return.
    ret_of: Vec<usize>,
    head: usize,
}

impl Entries {
    fn new<T>(ops: &[SearchOp<T>]) -> Entries {
        let mut order: Vec<(usize, bool, usize)> = Vec::with_capacity(ops.len() * 2);
        for (i, op) in ops.iter().enumerate() {
            if let Some(ret) = op.ret {
                order.push((op.call, false, i));
                order.push((ret, true, i));
            }
        }
        order.sort_unstable();
        let m = order.len();
        let head = m;
        let mut entries = Entries {
            op: order.iter().map(|e| e.2).collect(),
            is_call: order.iter().map(|e| !e.1).collect(),
            next: (1..=m).map(|j| if j < m { j } else { NIL }).collect(),
            prev: (0..m).map(|j| if j == 0 { head } else { j - 1 }).collect(),
            ret_of: vec![NIL; ops.len()],
            head,
        };
        entries.next.push(if m > 0 { 0 } else { NIL });
        entries.prev.push(NIL);
        for (j, e) in order.iter().enumerate() {
            if e.1 {
                entries.ret_of[e.2] = j;
            }
        }
        entries
    }

    fn first(&self) -> usize {
        self.next[self.head]
    }

    fn unlink(&mut self, x: usize) {
        let (p, n) = (self.prev[x], self.next[x]);
        self.next[p] = n;
        if n != NIL {
            self.prev[n] = p;
        }
    }

    fn relink(&mut self, x: usize) {
        let (p, n) = (self.prev[x], self.next[x]);
        self.next[p] = x;
        if n != NIL {
            self.prev[n] = x;
        }
    }

    /// Takes a call entry and its operation's return out of the list.
    fn lift(&mut self, call: usize) {
        self.unlink(call);
        self.unlink(self.ret_of[self.op[call]]);
    }

    /// Undoes [`Entries::lift`]; lifts must be undone in reverse order.
    fn unlift(&mut self, call: usize) {
        self.relink(self.ret_of[self.op[call]]);
        self.relink(call);
    }

    /// The first return entry at or after `from`, if any.
    fn first_return_from(&self, mut from: usize) -> usize {
        while from != NIL && self.is_call[from] {
            from = self.next[from];
        }
        from
    }
}

/// The memo (see the module documentation).
struct Memo<S> {
    seen: HashMap<(Vec<u64>, S), Vec<Vec<u64>>, FixedHasher>,
}

/// A hasher without random keys: no randomness, same work on every run.
type FixedHasher = BuildHasherDefault<DefaultHasher>;

fn subset(a: &[u64], b: &[u64]) -> bool {
    a.iter().zip(b).all(|(x, y)| x & !y == 0)
}

impl<S: Copy + Eq + Hash> Memo<S> {
    /// Records the state; false if it (or a better one) was seen before.
    /// Adds the work done to `work`.
    fn insert(&mut self, definite: &[u64], unknown: &[u64], state: S, work: &mut u64) -> bool {
        *work += (definite.len() + unknown.len()) as u64;
        let seen = self.seen.entry((definite.to_vec(), state)).or_default();
        *work += (seen.len() * unknown.len()) as u64;
        if seen.iter().any(|a| subset(a, unknown)) {
            return false;
        }
        seen.retain(|a| !subset(unknown, a));
        seen.push(unknown.to_vec());
        true
    }
}

/// The linearized operations: definite ones and unknown ones apart.
struct Bits {
    definite: Vec<u64>,
    unknown: Vec<u64>,
}

impl Bits {
    fn flip<T>(&mut self, ops: &[SearchOp<T>], i: usize) {
        let set = match ops.get(i) {
            Some(op) if op.ret.is_none() => &mut self.unknown,
            _ => &mut self.definite,
        };
        if let Some(w) = set.get_mut(i / 64) {
            *w ^= 1 << (i % 64);
        }
    }
}

/// A choice the search made, to be undone when backtracking.
enum Frame<S> {
    /// The definite operation at list entry `entry` was linearized (as a
    /// no-op if `no_op`) in state `previous`.
    Applied {
        entry: usize,
        previous: S,
        no_op: bool,
    },
    /// The unknown operation `op` was applied in state `previous`.
    AppliedUnknown { op: usize, previous: S },
    /// The definite operation at `entry` could not take effect; the search
    /// went on without it. Still to try: applying `candidates[next..]`
    /// (unknown operations) just before it.
    Need {
        entry: usize,
        candidates: Vec<usize>,
        next: usize,
    },
}

/// The search's position and choices.
struct Search<'a, M: Model> {
    ops: &'a [SearchOp<M::Step>],
    /// Unknown operations, by call rank.
    unknowns: Vec<usize>,
    list: Entries,
    bits: Bits,
    memo: Memo<M::State>,
    stack: Vec<Frame<M::State>>,
    state: M::State,
    applied: usize,
    deepest: usize,
    blocked: Option<usize>,
    work: u64,
}

impl<M: Model> Search<'_, M> {
    /// Linearizes `i` (a definite operation at list entry `entry`, or an
    /// unknown one) leading to `next`, unless the memo has seen as good a
    /// state; true if done.
    fn apply(&mut self, i: usize, entry: Option<usize>, next: M::State, no_op: bool) -> bool {
        self.bits.flip(self.ops, i);
        if !self.memo.insert(
            &self.bits.definite,
            &self.bits.unknown,
            next,
            &mut self.work,
        ) {
            self.bits.flip(self.ops, i);
            return false;
        }
        let previous = self.state;
        self.stack.push(match entry {
            Some(entry) => {
                self.list.lift(entry);
                Frame::Applied {
                    entry,
                    previous,
                    no_op,
                }
            }
            None => Frame::AppliedUnknown { op: i, previous },
        });
        self.state = next;
        self.applied += 1;
        if self.applied > self.deepest {
            self.deepest = self.applied;
            self.blocked = None;
        }
        true
    }

    /// The unknown operations not applied yet that may take effect just
    /// before the list entry `entry`: invoked before the first pending
    /// return.
    fn available(&self, entry: usize) -> Vec<(usize, &M::Step)> {
        let ret = self.list.first_return_from(entry);
        let limit = self
            .list
            .op
            .get(ret)
            .and_then(|&i| self.ops.get(i))
            .and_then(|op| op.ret)
            .unwrap_or(usize::MAX);
        self.unknowns
            .iter()
            .filter_map(|&u| self.ops.get(u).map(|op| (u, op)))
            .take_while(|(_, op)| op.call < limit)
            .filter(|(u, _)| self.bits.unknown[u / 64] & (1 << (u % 64)) == 0)
            .map(|(u, op)| (u, &op.step))
            .collect()
    }
}

/// Searches for a linearization of `ops` from `initial`, giving up after
/// `budget` units of work (one per step, plus one per memo word stored or
/// compared, so that the budget also bounds memory).
pub(crate) fn search<M: Model>(
    model: &M,
    ops: &[SearchOp<M::Step>],
    initial: M::State,
    budget: u64,
) -> SearchResult {
    enum Mode {
        Scan(usize),
        Backtrack,
    }
    let words = ops.len().div_ceil(64);
    let mut unknowns: Vec<usize> = (0..ops.len()).filter(|&i| ops[i].ret.is_none()).collect();
    unknowns.sort_by_key(|&i| ops[i].call);
    let mut s: Search<'_, M> = Search {
        ops,
        unknowns,
        list: Entries::new(ops),
        bits: Bits {
            definite: vec![0; words],
            unknown: vec![0; words],
        },
        memo: Memo {
            seen: HashMap::default(),
        },
        stack: Vec::new(),
        state: initial,
        applied: 0,
        deepest: 0,
        blocked: None,
        work: 0,
    };
    let mut mode = Mode::Scan(s.list.first());
    loop {
        s.work += 1;
        if s.work > budget {
            return SearchResult::Exhausted;
        }
        match mode {
            Mode::Scan(cur) => {
                if cur == NIL {
                    return SearchResult::Linearizable;
                }
                let i = s.list.op[cur];
                let Some(op) = ops.get(i) else {
                    return SearchResult::Exhausted;
                };
                if !s.list.is_call[cur] {
                    if s.applied == s.deepest && s.blocked.is_none() {
                        s.blocked = Some(i);
                    }
                    mode = Mode::Backtrack;
                    continue;
                }
                let linearized = match model.step(s.state, &op.step) {
                    Some(next) => s.apply(i, Some(cur), next, false),
                    None => {
                        let available = s.available(cur);
                        let candidates = if available.is_empty() {
                            Vec::new()
                        } else {
                            model.enablers(s.state, &op.step, &available)
                        };
                        if !candidates.is_empty() {
                            s.stack.push(Frame::Need {
                                entry: cur,
                                candidates,
                                next: 0,
                            });
                        }
                        false
                    }
                };
                mode = if linearized || (op.skippable && s.apply(i, Some(cur), s.state, true)) {
                    Mode::Scan(s.list.first())
                } else {
                    Mode::Scan(s.list.next[cur])
                };
            }
            Mode::Backtrack => match s.stack.pop() {
                None => {
                    return SearchResult::NotLinearizable {
                        deepest: s.deepest,
                        blocked: s.blocked.unwrap_or(0),
                    }
                }
                Some(Frame::Applied {
                    entry,
                    previous,
                    no_op,
                }) => {
                    let i = s.list.op[entry];
                    s.bits.flip(ops, i);
                    s.state = previous;
                    s.list.unlift(entry);
                    s.applied -= 1;
                    let skippable = ops.get(i).is_some_and(|o| o.skippable);
                    mode = if skippable && !no_op && s.apply(i, Some(entry), s.state, true) {
                        Mode::Scan(s.list.first())
                    } else {
                        Mode::Scan(s.list.next[entry])
                    };
                }
                Some(Frame::AppliedUnknown { op, previous }) => {
                    s.bits.flip(ops, op);
                    s.state = previous;
                    s.applied -= 1;
                    // Back to the need that applied it: its next candidate.
                    mode = Mode::Backtrack;
                }
                Some(Frame::Need {
                    entry,
                    candidates,
                    next,
                }) => {
                    let Some(&u) = candidates.get(next) else {
                        mode = Mode::Backtrack;
                        continue;
                    };
                    s.stack.push(Frame::Need {
                        entry,
                        candidates,
                        next: next + 1,
                    });
                    let after = ops.get(u).and_then(|op| model.step(s.state, &op.step));
                    mode = match after {
                        Some(after) if s.apply(u, None, after, false) => Mode::Scan(s.list.first()),
                        _ => Mode::Backtrack,
                    };
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A counter: `Add(d)` adds d; `Read(v)` expects v.
    #[derive(Debug, Clone)]
    enum C {
        Add(i64),
        Read(i64),
    }

    struct Counter;

    impl Model for Counter {
        type State = i64;
        type Step = C;
        fn step(&self, state: i64, c: &C) -> Option<i64> {
            match c {
                C::Add(d) => Some(state + d),
                C::Read(v) => (state == *v).then_some(state),
            }
        }
    }

    fn run(ops: &[SearchOp<C>], budget: u64) -> SearchResult {
        search(&Counter, ops, 0, budget)
    }

    fn op(call: usize, ret: Option<usize>, step: C) -> SearchOp<C> {
        SearchOp {
            call,
            ret,
            skippable: false,
            step,
        }
    }

    #[test]
    fn empty_history_is_linearizable() {
        let ops: Vec<SearchOp<C>> = Vec::new();
        assert_eq!(run(&ops, 100), SearchResult::Linearizable);
    }

    #[test]
    fn concurrent_operations_may_be_reordered() {
        // add(1) [0,3] overlaps read->0 [1,2]: the read goes first.
        let ops = vec![op(0, Some(3), C::Add(1)), op(1, Some(2), C::Read(0))];
        assert_eq!(run(&ops, 100), SearchResult::Linearizable);
    }

    #[test]
    fn real_time_order_is_respected() {
        // add(1) [0,1] then read->0 [2,3]: impossible.
        let ops = vec![op(0, Some(1), C::Add(1)), op(2, Some(3), C::Read(0))];
        assert_eq!(
            run(&ops, 100),
            SearchResult::NotLinearizable {
                deepest: 1,
                blocked: 1
            }
        );
    }

    #[test]
    fn operations_at_infinity_are_optional() {
        // add(5) unknown; read->0 afterwards is fine, and so is read->5.
        let ops = vec![op(0, None, C::Add(5)), op(1, Some(2), C::Read(0))];
        assert_eq!(run(&ops, 100), SearchResult::Linearizable);
        let ops = vec![op(0, None, C::Add(5)), op(1, Some(2), C::Read(5))];
        assert_eq!(run(&ops, 100), SearchResult::Linearizable);
    }

    #[test]
    fn skippable_operations_may_be_left_out_but_keep_their_deadline() {
        // add(1) [0,1] skippable, then read->0 [2,3]: left out.
        let mut ops = vec![op(0, Some(1), C::Add(1)), op(2, Some(3), C::Read(0))];
        ops[0].skippable = true;
        assert_eq!(run(&ops, 100), SearchResult::Linearizable);
        // add(1) [0,1] skippable, add(2) [2,3], read->3 [4,5]: needs the
        // effect of add(1), which is tried first.
        let mut ops = vec![
            op(0, Some(1), C::Add(1)),
            op(2, Some(3), C::Add(2)),
            op(4, Some(5), C::Read(3)),
        ];
        ops[0].skippable = true;
        assert_eq!(run(&ops, 100), SearchResult::Linearizable);
        // read->5 [0,1] skippable, add(1) [2,3], read->0 [4,5]: impossible
        // whether or not the first read is left out.
        let mut ops = vec![
            op(0, Some(1), C::Read(5)),
            op(2, Some(3), C::Add(1)),
            op(4, Some(5), C::Read(0)),
        ];
        ops[0].skippable = true;
        assert!(matches!(
            run(&ops, 100),
            SearchResult::NotLinearizable { .. }
        ));
    }

    #[test]
    fn unknown_operations_are_applied_where_needed_at_most_once() {
        // add(5) unknown [0,∞): read 0, read 5, read 5 all fine.
        let ops = vec![
            op(0, None, C::Add(5)),
            op(1, Some(2), C::Read(0)),
            op(3, Some(4), C::Read(5)),
            op(5, Some(6), C::Read(5)),
        ];
        assert_eq!(run(&ops, 1000), SearchResult::Linearizable);
        // Two unknown add(5): read 10 needs both.
        let ops = vec![
            op(0, None, C::Add(5)),
            op(1, None, C::Add(5)),
            op(3, Some(4), C::Read(10)),
        ];
        assert_eq!(run(&ops, 1000), SearchResult::Linearizable);
        // One unknown add(5) cannot explain read 10.
        let ops = vec![op(0, None, C::Add(5)), op(3, Some(4), C::Read(10))];
        assert!(matches!(
            run(&ops, 1000),
            SearchResult::NotLinearizable { .. }
        ));
        // An unknown operation invoked after a read returned cannot help it.
        let ops = vec![op(0, Some(1), C::Read(5)), op(2, None, C::Add(5))];
        assert!(matches!(
            run(&ops, 1000),
            SearchResult::NotLinearizable { .. }
        ));
    }

    #[test]
    fn the_budget_bounds_the_work() {
        let ops: Vec<SearchOp<C>> = (0..20).map(|i| op(i, Some(40 + i), C::Add(1))).collect();
        assert_eq!(run(&ops, 3), SearchResult::Exhausted);
    }
}
