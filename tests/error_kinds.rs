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

/// The exit codes docs/CLI.md's table has, as its first column gives them
/// (`129, 130, 143` is one row).
fn documented_codes() -> Vec<String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/CLI.md")).unwrap();
    let table = doc.split("## Exit codes").nth(1).unwrap();
    let table = table
        .split("\n\n")
        .find(|block| block.trim_start().starts_with("| code"))
        .unwrap();
    table
        .lines()
        .skip(2)
        .filter_map(|row| row.split('|').nth(1).map(|c| c.trim().to_owned()))
        .collect()
}

/// `sessionfs --help` lists every exit code docs/CLI.md has, and no other:
/// one line each, the code (or codes) first. (Issue 35: 9 was missing.)
#[test]
fn help_lists_every_exit_code_of_cli_md() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sessionfs"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    let block = help
        .split("Exit codes")
        .nth(1)
        .expect("--help has an exit-code list")
        .split("\n\n")
        .next()
        .unwrap();
    // Each line: two spaces, the code cell, two or more spaces, its meaning.
    let listed: Vec<String> = block
        .lines()
        .skip(1)
        .map(|l| {
            let l = l.trim_start();
            let end = l.find("  ").expect("a meaning after the code");
            assert!(!l[end..].trim().is_empty(), "{l:?} has no meaning");
            l[..end].to_owned()
        })
        .collect();
    assert_eq!(listed, documented_codes(), "--help:\n{help}");
}
