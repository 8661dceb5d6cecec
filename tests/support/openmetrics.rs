//! A strict parser of the OpenMetrics text format, for the families this project
//! exposes (counter, gauge, histogram). It rejects what the specification forbids:
//! samples outside a declared family, interleaved or repeated families, names with the
//! wrong suffix for their type, a unit missing from the name, a missing or early
//! `# EOF`, and histograms whose buckets are not cumulative or disagree with `_count`.

use std::collections::{BTreeMap, HashMap};

/// Label name to value.
pub type Labels = BTreeMap<String, String>;

/// One sample line.
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: Labels,
    pub value: f64,
}

/// One metric family with its metadata and samples.
#[derive(Debug, Clone, Default)]
pub struct Family {
    pub name: String,
    pub kind: String,
    pub help: Option<String>,
    pub unit: Option<String>,
    pub samples: Vec<Sample>,
}

/// A parsed exposition: families by name.
#[derive(Debug, Default)]
pub struct Exposition {
    pub families: HashMap<String, Family>,
}

impl Exposition {
    /// The value of the sample `name` whose labels include every pair of `labels`;
    /// None when no sample matches, panics when several do.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let matching: Vec<&Sample> = self
            .families
            .values()
            .flat_map(|f| &f.samples)
            .filter(|s| s.name == name)
            .filter(|s| {
                labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect();
        assert!(
            matching.len() <= 1,
            "{name} {labels:?} matches {} samples",
            matching.len()
        );
        matching.first().map(|s| s.value)
    }
}

fn is_metric_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn is_label_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn parse_value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => s.parse().map_err(|_| format!("bad number {s:?}")),
    }
}

/// `{a="x",b="y"}` → labels; `rest` starts just after the `{`.
fn parse_labels(rest: &str) -> Result<(Labels, &str), String> {
    let mut labels = Labels::new();
    let mut rest = rest;
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return Ok((labels, after));
        }
        let eq = rest.find('=').ok_or("label without =")?;
        let name = &rest[..eq];
        if !is_label_name(name) {
            return Err(format!("bad label name {name:?}"));
        }
        let mut chars = rest[eq + 1..].char_indices();
        if chars.next().map(|(_, c)| c) != Some('"') {
            return Err(format!("label {name} value is not quoted"));
        }
        let mut value = String::new();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, '\\')) => value.push('\\'),
                    other => return Err(format!("bad escape {other:?}")),
                },
                Some((i, '"')) => break eq + 1 + i + 1,
                Some((_, c)) => value.push(c),
                None => return Err("unterminated label value".into()),
            }
        };
        if labels.insert(name.to_owned(), value).is_some() {
            return Err(format!("label {name} repeated"));
        }
        rest = &rest[end..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
}

/// The suffixes a sample of a family of `kind` may add to the family's name.
fn suffixes(kind: &str) -> &'static [&'static str] {
    match kind {
        "counter" => &["_total", "_created"],
        "gauge" => &[""],
        "histogram" => &["_bucket", "_count", "_sum", "_created"],
        _ => &[],
    }
}

/// Parses `text` strictly; the error names the offending line.
pub fn parse(text: &str) -> Result<Exposition, String> {
    let mut exposition = Exposition::default();
    let mut order: Vec<String> = Vec::new();
    let mut saw_eof = false;
    for (n, line) in text.split_terminator('\n').enumerate() {
        let at = |e: String| format!("line {}: {e}: {line:?}", n + 1);
        if saw_eof {
            return Err(at("content after # EOF".into()));
        }
        if line == "# EOF" {
            saw_eof = true;
            continue;
        }
        if let Some(meta) = line.strip_prefix("# ") {
            let mut parts = meta.splitn(3, ' ');
            let (keyword, name) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let arg = parts.next();
            if !is_metric_name(name) {
                return Err(at(format!("bad family name {name:?}")));
            }
            if order.last().map(String::as_str) != Some(name) {
                if exposition.families.contains_key(name) {
                    return Err(at(format!("family {name} interleaved or repeated")));
                }
                order.push(name.to_owned());
                exposition.families.insert(
                    name.to_owned(),
                    Family {
                        name: name.to_owned(),
                        kind: "unknown".into(),
                        ..Family::default()
                    },
                );
            }
            let family = exposition.families.get_mut(name).expect("inserted above");
            if !family.samples.is_empty() {
                return Err(at("metadata after samples".into()));
            }
            match (keyword, arg) {
                ("TYPE", Some(kind)) if !suffixes(kind).is_empty() => family.kind = kind.into(),
                ("HELP", help) => family.help = Some(help.unwrap_or("").to_owned()),
                ("UNIT", Some(unit)) => {
                    if !name.ends_with(&format!("_{unit}")) {
                        return Err(at(format!("unit {unit} is not the suffix of {name}")));
                    }
                    family.unit = Some(unit.into());
                }
                _ => return Err(at("unknown metadata line".into())),
            }
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            return Err(at("not a sample, metadata or # EOF".into()));
        }
        let name_end = line.find(['{', ' ']).ok_or_else(|| at("no value".into()))?;
        let name = &line[..name_end];
        let (labels, rest) = if line[name_end..].starts_with('{') {
            parse_labels(&line[name_end + 1..]).map_err(at)?
        } else {
            (Labels::new(), &line[name_end..])
        };
        let rest = rest
            .strip_prefix(' ')
            .ok_or_else(|| at("no space before the value".into()))?;
        let mut fields = rest.split(' ');
        let value = parse_value(fields.next().unwrap_or("")).map_err(at)?;
        if fields.next().is_some() {
            return Err(at("timestamps and exemplars are not expected".into()));
        }
        let family_name = order
            .last()
            .ok_or_else(|| at("sample before any family".into()))?;
        let family = exposition
            .families
            .get_mut(family_name)
            .expect("declared above");
        let suffix = name
            .strip_prefix(family_name.as_str())
            .ok_or_else(|| at(format!("sample outside its family {family_name}")))?;
        if !suffixes(&family.kind).contains(&suffix) {
            return Err(at(format!(
                "suffix {suffix:?} not allowed for a {}",
                family.kind
            )));
        }
        if family.kind == "counter" && value < 0.0 {
            return Err(at("negative counter".into()));
        }
        family.samples.push(Sample {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    if !saw_eof {
        return Err("no # EOF at the end".into());
    }
    for family in exposition.families.values() {
        if family.kind == "unknown" {
            return Err(format!("family {} has no TYPE", family.name));
        }
        if family.kind == "histogram" {
            check_histogram(family)?;
        }
    }
    Ok(exposition)
}

/// Buckets cumulative in `le`, `+Inf` present and equal to `_count`, for every series.
fn check_histogram(family: &Family) -> Result<(), String> {
    let mut series: BTreeMap<Labels, Vec<(f64, f64)>> = BTreeMap::new();
    let mut counts: BTreeMap<Labels, f64> = BTreeMap::new();
    for sample in &family.samples {
        let mut labels = sample.labels.clone();
        if sample.name.ends_with("_bucket") {
            let le = labels
                .remove("le")
                .ok_or_else(|| format!("{} bucket without le", family.name))?;
            series
                .entry(labels)
                .or_default()
                .push((parse_value(&le)?, sample.value));
        } else if sample.name.ends_with("_count") {
            counts.insert(labels, sample.value);
        }
    }
    if series.len() != counts.len() {
        return Err(format!("{}: buckets and counts disagree", family.name));
    }
    for (labels, mut buckets) in series {
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        if buckets.windows(2).any(|w| w[1].1 < w[0].1) {
            return Err(format!(
                "{} {labels:?}: buckets not cumulative",
                family.name
            ));
        }
        let inf = buckets
            .last()
            .filter(|b| b.0 == f64::INFINITY)
            .ok_or_else(|| format!("{} {labels:?}: no +Inf bucket", family.name))?;
        if Some(&inf.1) != counts.get(&labels) {
            return Err(format!("{} {labels:?}: +Inf bucket != _count", family.name));
        }
    }
    Ok(())
}
