//! Circles and floors of a file graph.
//!
//! A circle is a strongly connected component of more than one file. Floors
//! count from the bottom: a file that imports nothing in the crate is on
//! floor 1, any other file one floor above the highest file it imports; the
//! files of a circle share one floor.

use super::resolve::Edges;

/// The shape of a crate's file graph.
#[derive(Debug, PartialEq, Eq)]
pub struct Layout {
    /// Floor of each file (1-based), by file index.
    pub floor: Vec<usize>,
    /// The circles, each its files in ascending order; circles ordered by
    /// their first file.
    pub circles: Vec<Vec<usize>>,
    /// For each file, the index into `circles` of its circle, if any.
    pub circle_of: Vec<Option<usize>>,
}

/// Floors and circles of a graph of `n` files.
pub fn layout(n: usize, edges: &Edges) -> Layout {
    let successors: Vec<Vec<usize>> = (0..n)
        .map(|f| {
            edges
                .get(&f)
                .map_or_else(Vec::new, |to| to.keys().copied().collect())
        })
        .collect();
    let components = strongly_connected(&successors);
    let mut component_of = vec![0; n];
    for (c, files) in components.iter().enumerate() {
        for &f in files {
            component_of[f] = c;
        }
    }
    // Tarjan's algorithm emits a component only after every component it
    // reaches, so one pass in emission order sees imported floors first.
    let mut component_floor = vec![1; components.len()];
    for (c, files) in components.iter().enumerate() {
        let mut floor = 1;
        for &f in files {
            for &to in &successors[f] {
                let d = component_of[to];
                if d != c {
                    floor = floor.max(component_floor[d] + 1);
                }
            }
        }
        component_floor[c] = floor;
    }
    let mut circles: Vec<Vec<usize>> = components
        .into_iter()
        .filter(|files| files.len() > 1)
        .map(|mut files| {
            files.sort_unstable();
            files
        })
        .collect();
    circles.sort();
    let mut circle_of = vec![None; n];
    for (i, files) in circles.iter().enumerate() {
        for &f in files {
            circle_of[f] = Some(i);
        }
    }
    Layout {
        floor: (0..n).map(|f| component_floor[component_of[f]]).collect(),
        circles,
        circle_of,
    }
}

/// Tarjan's strongly connected components, iteratively; each component is
/// emitted after all components reachable from it.
fn strongly_connected(successors: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let n = successors.len();
    let mut index = vec![usize::MAX; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut components = Vec::new();
    let mut next = 0;
    for start in 0..n {
        if index[start] != usize::MAX {
            continue;
        }
        // (node, position in its successor list)
        let mut work = vec![(start, 0usize)];
        index[start] = next;
        low[start] = next;
        next += 1;
        stack.push(start);
        on_stack[start] = true;
        while let Some(&(v, pos)) = work.last() {
            if let Some(&w) = successors[v].get(pos) {
                if let Some(top) = work.last_mut() {
                    top.1 += 1;
                }
                if index[w] == usize::MAX {
                    index[w] = next;
                    low[w] = next;
                    next += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut component = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                components.push(component);
            }
        }
    }
    components
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(pairs: &[(usize, usize)]) -> Edges {
        let mut edges = Edges::new();
        for &(a, b) in pairs {
            edges.entry(a).or_default().entry(b).or_default();
        }
        edges
    }

    #[test]
    fn floors_stack_and_circles_share_a_floor() {
        // 0 -> 1 -> 2 <-> 3 -> 4; 5 alone
        let layout = layout(6, &graph(&[(0, 1), (1, 2), (2, 3), (3, 2), (3, 4)]));
        assert_eq!(layout.floor, [4, 3, 2, 2, 1, 1]);
        assert_eq!(layout.circles, [vec![2, 3]]);
        assert_eq!(layout.circle_of, [None, None, Some(0), Some(0), None, None]);
    }

    #[test]
    fn a_dag_has_no_circles() {
        let layout = layout(3, &graph(&[(0, 1), (0, 2), (1, 2)]));
        assert_eq!(layout.floor, [3, 2, 1]);
        assert!(layout.circles.is_empty());
    }
}
