//! Names the first few of a list and counts the rest by group, so that no probe body,
//! log line or report grows with the number of objects.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt::{self, Write};

/// How many items a list names before it counts the rest.
pub(crate) const NAMED: usize = 5;

/// How many groups the count of the rest names before it counts the other groups.
const GROUPS: usize = 8;

/// The most bytes of one named item: an object's name may be long.
pub(crate) const ITEM_BYTES: usize = 256;

/// The first `few` of `items` by `first` (the greatest first, e.g. the longest running),
/// each as `name` gives it, joined by `separator`; then `and N more: G1 n1, G2 n2`,
/// counted by `group`. Linear in the number of items: only the named few are sorted.
/// Of `("web", "a", 30), ("web", "b", 10), ("db", "c", 20)`, the first 2 by the number,
/// named by the two words and grouped by the first, are `web a; db c; and 1 more: web 1`.
pub(crate) fn name_few<'a, T, R, G>(
    items: &'a [T],
    few: usize,
    separator: &str,
    first: impl Fn(&T) -> R,
    name: impl Fn(&T) -> String,
    group: impl Fn(&'a T) -> G,
) -> String
where
    R: Ord,
    G: Ord + fmt::Display,
{
    let mut order: Vec<usize> = (0..items.len()).collect();
    let by_first = |a: &usize, b: &usize| -> Ordering { first(&items[*b]).cmp(&first(&items[*a])) };
    let named = few.min(order.len());
    if named < order.len() && named > 0 {
        order.select_nth_unstable_by(named - 1, by_first);
    }
    order.truncate(named);
    order.sort_unstable_by(by_first);

    let mut out = String::new();
    for (i, index) in order.iter().enumerate() {
        if i > 0 {
            out.push_str(separator);
        }
        out.push_str(&clip(name(&items[*index]), ITEM_BYTES));
    }
    let rest = items.len() - named;
    if rest > 0 {
        let mut named_set = vec![false; items.len()];
        for index in &order {
            named_set[*index] = true;
        }
        let mut counts: BTreeMap<G, usize> = BTreeMap::new();
        for (index, item) in items.iter().enumerate() {
            if !named_set[index] {
                *counts.entry(group(item)).or_default() += 1;
            }
        }
        if !out.is_empty() {
            out.push_str(separator);
        }
        out.push_str(&count_rest(rest, &counts));
    }
    out
}

/// `and N more: G1 n1, G2 n2`.
fn count_rest<G: fmt::Display>(rest: usize, counts: &BTreeMap<G, usize>) -> String {
    format!(
        "and {rest} more: {}",
        count_groups(counts.iter().map(|(g, n)| (g, *n)))
    )
}

/// `G1 n1, G2 n2, …`: counts per group, the largest first, naming at most `GROUPS`
/// groups and counting the others together.
pub(crate) fn count_groups<G: fmt::Display>(
    groups: impl IntoIterator<Item = (G, usize)>,
) -> String {
    let mut groups: Vec<(G, usize)> = groups.into_iter().collect();
    // Stable: equal counts keep the groups' own order.
    groups.sort_by_key(|g| std::cmp::Reverse(g.1));
    let mut out = String::new();
    for (i, (group, n)) in groups.iter().take(GROUPS).enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{} {n}", clip(group.to_string(), ITEM_BYTES));
    }
    if groups.len() > GROUPS {
        let others: usize = groups[GROUPS..].iter().map(|(_, n)| *n).sum();
        let _ = write!(out, ", {others} in {} other groups", groups.len() - GROUPS);
    }
    out
}

/// `text` cut to at most `max` bytes at a character boundary, marked with `…`.
#[must_use]
pub(crate) fn clip(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push('…');
    text
}

/// Whether two names are the same: by address first (a controller's reconciles share
/// one), by text otherwise.
pub(crate) fn same_name(a: &std::sync::Arc<str>, b: &std::sync::Arc<str>) -> bool {
    std::sync::Arc::ptr_eq(a, b) || **a == **b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_few_of_its_doc() {
        let running = [("web", "a", 30), ("web", "b", 10), ("db", "c", 20)];
        let text = name_few(
            &running,
            2,
            "; ",
            |r| r.2,
            |r| format!("{} {}", r.0, r.1),
            |r| r.0,
        );
        assert_eq!(text, "web a; db c; and 1 more: web 1");
    }

    #[test]
    fn names_the_first_few_and_counts_the_rest_by_group() {
        let items: Vec<(String, &str, u32)> = (0..300)
            .map(|i| {
                let controller = if i % 3 == 0 { "web" } else { "configtemplates" };
                (format!("ns/o-{i}"), controller, i)
            })
            .collect();
        let text = name_few(
            &items,
            3,
            "; ",
            |i| i.2,
            |i| i.0.clone(),
            |i| format!("{} awaiting", i.1),
        );
        assert_eq!(
            text,
            "ns/o-299; ns/o-298; ns/o-297; and 297 more: configtemplates awaiting 198, web awaiting 99"
        );
    }

    #[test]
    fn a_short_list_is_named_whole() {
        let items = [1, 2];
        assert_eq!(
            name_few(&items, 5, ", ", |i| *i, |i| i.to_string(), |_| "x"),
            "2, 1"
        );
        assert_eq!(
            name_few(&[] as &[u8], 5, ", ", |i| *i, |i| i.to_string(), |_| "x"),
            ""
        );
        assert_eq!(
            name_few(&items, 0, ", ", |i| *i, |i| i.to_string(), |_| "x"),
            "and 2 more: x 2"
        );
    }

    #[test]
    fn many_groups_and_long_names_stay_bounded() {
        let items: Vec<(String, usize)> = (0..10_000)
            .map(|i| ("n".repeat(1000) + &i.to_string(), i % 500))
            .collect();
        let text = name_few(
            &items,
            NAMED,
            "; ",
            |i| i.1,
            |i| i.0.clone(),
            |i| format!("controller-{:03}", i.1),
        );
        assert!(text.len() < 2048, "{} bytes", text.len());
        assert!(text.contains("in 492 other groups"), "{text}");
    }

    #[test]
    fn clipping_respects_characters() {
        assert_eq!(clip("ééé".into(), 4), "…");
        assert_eq!(clip("abcdef".into(), 5), "ab…");
        assert_eq!(clip("abc".into(), 5), "abc");
    }
}
