//! docs/CLI.md's table of exit codes and error kinds is the contract for
//! `kind`: it lists every kind the code has (`ErrorKind`), and every kind
//! it lists is one the code has.

use sessionfs::api::ErrorKind;

/// The kinds docs/CLI.md's exit-code table names (third column, in
/// backquotes), with the exit code of their row.
fn documented() -> Vec<(String, u8)> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/CLI.md")).unwrap();
    let table = doc
        .split("## Exit codes")
        .nth(1)
        .expect("CLI.md has an exit-code table")
        .split("\n\n")
        .find(|block| block.trim_start().starts_with("| code"))
        .expect("the table follows its heading");
    let mut kinds = Vec::new();
    for row in table.lines().skip(2) {
        let cells: Vec<&str> = row.split('|').collect();
        let (Some(code), Some(names)) = (cells.get(1), cells.get(3)) else {
            continue;
        };
        // `129, 130, 143`: the first stands for the row.
        let code: u8 = code.trim().split(',').next().unwrap().parse().unwrap();
        // Each backquoted name, outside parentheses (which quote examples).
        let mut depth = 0;
        let mut rest = *names;
        while let Some(c) = rest.chars().next() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                '`' if depth == 0 => {
                    let end = rest[1..].find('`').unwrap() + 1;
                    kinds.push((rest[1..end].to_owned(), code));
                    rest = &rest[end..];
                }
                _ => {}
            }
            rest = &rest[c.len_utf8()..];
        }
    }
    kinds
}

/// Whether documented name `doc` (`manifest_*` stands for a family)
/// names kind `k`.
fn names(doc: &str, k: ErrorKind) -> bool {
    match doc.strip_suffix('*') {
        Some(prefix) => k.as_str().starts_with(prefix),
        None => doc == k.as_str(),
    }
}

#[test]
fn every_error_kind_is_in_the_table_of_cli_md() {
    let docs = documented();
    let missing: Vec<&str> = ErrorKind::ALL
        .iter()
        .filter(|k| !docs.iter().any(|(d, _)| names(d, **k)))
        .map(|k| k.as_str())
        .collect();
    assert!(
        missing.is_empty(),
        "kinds docs/CLI.md does not list: {missing:?}"
    );
}

#[test]
fn every_kind_the_table_of_cli_md_lists_is_an_error_kind() {
    let unknown: Vec<String> = documented()
        .into_iter()
        .filter(|(d, _)| !ErrorKind::ALL.iter().any(|k| names(d, *k)))
        .map(|(d, code)| format!("{d} (exit {code})"))
        .collect();
    assert!(
        unknown.is_empty(),
        "docs/CLI.md lists kinds the code lacks: {unknown:?}"
    );
}
