//! Real-time order queries shared by the checkers.

use crate::history::Operation;

/// Pairs `(i, j)` where `befores[i]` definitely ended before `afters[j]` was
/// invoked, yet carries a higher number: `befores[i].1 > afters[j].1`.
///
/// For each `j` at most one pair is returned, with the latest-ending such
/// `i` (the shortest witness); at most `cap` pairs in all, in `afters`
/// order. O((n + m) log n) when nothing is wrong.
pub(crate) fn later_lower(
    befores: &[(&Operation, u64)],
    afters: &[(&Operation, u64)],
    cap: usize,
) -> Vec<(usize, usize)> {
    let mut ends: Vec<(u64, usize)> = befores
        .iter()
        .enumerate()
        .filter_map(|(i, (op, _))| op.definite_end_ns().map(|end| (end, i)))
        .collect();
    ends.sort_unstable();
    let value = |k: usize| ends.get(k).and_then(|(_, i)| befores.get(*i)).map(|b| b.1);
    let mut prefix_max = Vec::with_capacity(ends.len());
    let mut max = 0u64;
    for k in 0..ends.len() {
        max = max.max(value(k).unwrap_or(0));
        prefix_max.push(max);
    }
    let mut pairs = Vec::new();
    for (j, (op, v)) in afters.iter().enumerate() {
        if pairs.len() >= cap {
            break;
        }
        let n = ends.partition_point(|(end, _)| *end < op.invoke_ns());
        if n == 0 || prefix_max.get(n - 1).is_none_or(|m| m <= v) {
            continue;
        }
        if let Some(k) = (0..n).rev().find(|&k| value(k).is_some_and(|b| b > *v)) {
            if let Some((_, i)) = ends.get(k) {
                pairs.push((*i, j));
            }
        }
    }
    pairs
}
