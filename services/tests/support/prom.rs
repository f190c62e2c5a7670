//! The tests' one reader of Prometheus text (the `/metrics` of the API server and of
//! kcache): every sample as its name, labels and value, and the sums the tests assert on.

/// Every sample of `text`: (metric name, labels, value). Comments and lines that do not
/// parse are skipped.
pub fn samples(text: &str) -> impl Iterator<Item = (&str, Vec<(String, String)>, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|line| {
            let (name, labels, rest) = match line.find('{') {
                Some(open) => {
                    let (labels, rest) = parse_labels(&line[open + 1..])?;
                    (&line[..open], labels, rest)
                }
                None => {
                    let (name, rest) = line.split_once(' ')?;
                    (name, Vec::new(), rest)
                }
            };
            let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
            Some((name, labels, value))
        })
}

/// The sum of the samples of `name` that carry every label of `want` with that value.
pub fn sum(text: &str, name: &str, want: &[(&str, &str)]) -> f64 {
    samples(text)
        .filter(|(n, labels, _)| {
            *n == name
                && want
                    .iter()
                    .all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|(_, _, v)| v)
        .sum()
}

/// [`sum`] with the labels written as the text writes them (`result="ok"`,
/// `cache="authz",decision="allow"`); `None`: every sample of `name`.
pub fn sum_samples(text: &str, name: &str, labels: Option<&str>) -> f64 {
    let want = match labels {
        None => Vec::new(),
        Some(l) => match parse_labels(&format!("{l}}}")) {
            Some((want, "")) => want,
            _ => panic!("not a Prometheus label set: {l}"),
        },
    };
    let want: Vec<(&str, &str)> = want.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    sum(text, name, &want)
}

/// [`sum`] over one label.
pub fn sum_samples_with_label(text: &str, name: &str, key: &str, value: &str) -> f64 {
    sum(text, name, &[(key, value)])
}

/// Parses `a="x",b="y\"z"} rest` into labels and `rest`.
fn parse_labels(s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start_matches([',', ' ']);
        if let Some(after) = rest.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = rest.find('=')?;
        let key = rest[..eq].trim().to_string();
        let mut chars = rest[eq + 1..].char_indices();
        if chars.next()?.1 != '"' {
            return None;
        }
        let mut value = String::new();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                '"' => {
                    end = Some(eq + 1 + i + 1);
                    break;
                }
                c => value.push(c),
            }
        }
        labels.push((key, value));
        rest = &rest[end?..];
    }
}
