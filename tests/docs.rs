//! The docs against the Makefile: `make help` prints every target that has a `## text` comment
//! whole, with the texts in one column, and README.md's Development table has a row for each of
//! them (and none for a target that is gone); CHANGELOG.md starts with the version Cargo.toml
//! builds. Runs `make --no-print-directory help` only: it builds nothing and writes no file.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

fn repo_file(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The Makefile's targets with a `## text` comment, in order, as `make help` finds them: a rule
/// line `name: [prerequisites] ## text`.
fn documented_targets(makefile: &str) -> Vec<String> {
    makefile
        .lines()
        .filter(|line| line.starts_with(|c: char| c.is_ascii_lowercase()))
        .filter_map(|line| {
            let (name, rest) = line.split_once(':')?;
            let is_name = name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            (is_name && !rest.starts_with('=') && rest.contains("## ")).then(|| name.to_string())
        })
        .collect()
}

/// Every name on the Makefile's `.PHONY:` lines.
fn phony_targets(makefile: &str) -> BTreeSet<String> {
    makefile
        .lines()
        .filter_map(|line| line.strip_prefix(".PHONY:"))
        .flat_map(|names| names.split_whitespace().map(str::to_string))
        .collect()
}

/// `make --no-print-directory help` in the repository, killed if it runs past 30 s.
fn make_help() -> String {
    let mut child = Command::new("make")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["--no-print-directory", "help"])
        // Run by `make test`, the flags of the outer make would be inherited.
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS")
        .env_remove("MAKELEVEL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run make");
    let mut stdout = child.stdout.take().expect("stdout");
    let reader = thread::spawn(move || {
        let mut text = String::new();
        stdout.read_to_string(&mut text).map(|_| text)
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for make") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("make help ran for more than 30 s");
        }
        thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "make help: {status}");
    reader.join().expect("reader").expect("make help's output")
}

/// The target lines of `make help`: the block after its first empty line.
fn help_lines(help: &str) -> Vec<&str> {
    help.lines()
        .skip_while(|line| !line.is_empty())
        .skip(1)
        .take_while(|line| !line.is_empty())
        .collect()
}

/// The targets named in the first column of README.md's Development table (`make name`; the
/// bare `make` names none).
fn readme_targets(readme: &str) -> BTreeSet<String> {
    let section = readme
        .split_once("\n## Development\n")
        .expect("README.md has a Development section")
        .1;
    let rows = section
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2); // the header and its separator
    let mut names = BTreeSet::new();
    for row in rows {
        let first = row.split(" | ").next().unwrap_or_default();
        for piece in first.split("`make ").skip(1) {
            let name = piece.split('`').next().unwrap_or_default();
            names.insert(name.to_string());
        }
    }
    names
}

#[test]
fn make_help_prints_every_documented_target_whole_in_one_column() {
    let makefile = repo_file("Makefile");
    let targets = documented_targets(&makefile);
    assert!(targets.len() > 10, "too few targets found: {targets:?}");
    let phony = phony_targets(&makefile);
    let not_phony: Vec<&String> = targets.iter().filter(|t| !phony.contains(*t)).collect();
    assert!(not_phony.is_empty(), "not in .PHONY: {not_phony:?}");

    let help = make_help();
    let lines = help_lines(&help);
    let listed: Vec<&str> = lines
        .iter()
        .map(|line| line.split_whitespace().next().unwrap_or_default())
        .collect();
    assert_eq!(listed, targets, "make help's targets:\n{help}");
    // Each text starts in the same column, after at least one space: a name longer than the
    // column would push its text to the right (or be cut).
    let columns: BTreeSet<usize> = lines
        .iter()
        .zip(&listed)
        .map(|(line, name)| {
            let after = line.find(name).expect("name") + name.len();
            assert!(line[after..].starts_with(' '), "{line:?}");
            after + line[after..].len() - line[after..].trim_start().len()
        })
        .collect();
    assert_eq!(columns.len(), 1, "texts in several columns:\n{help}");
}

#[test]
fn readme_development_table_has_a_row_for_every_target_of_make_help() {
    let targets: BTreeSet<String> = documented_targets(&repo_file("Makefile"))
        .into_iter()
        .collect();
    let documented = readme_targets(&repo_file("README.md"));
    let missing: Vec<&String> = targets.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "not in README.md's Development table: {missing:?}"
    );
    let unknown: Vec<&String> = documented.difference(&targets).collect();
    assert!(
        unknown.is_empty(),
        "in README.md's table, not in make help: {unknown:?}"
    );
}

/// CHANGELOG.md's newest entry is the version Cargo.toml builds (`## 0.2.0 (date)` first), its
/// entries run newest first, and each says what an upgrade to it needs.
#[test]
fn changelog_starts_with_this_version_and_says_what_each_upgrade_needs() {
    let changelog = repo_file("CHANGELOG.md");
    let releases: Vec<(&str, &str)> = changelog
        .split("\n## ")
        .skip(1)
        .map(|entry| entry.split_once(' ').unwrap_or((entry, "")))
        .collect();
    let versions: Vec<&str> = releases.iter().map(|(version, _)| *version).collect();
    assert_eq!(
        versions.first(),
        Some(&env!("CARGO_PKG_VERSION")),
        "CHANGELOG.md's newest entry should be Cargo.toml's version: {versions:?}"
    );
    let numbers: Vec<Vec<u64>> = versions
        .iter()
        .map(|v| v.split('.').map(|p| p.parse().unwrap()).collect())
        .collect();
    assert!(
        numbers.windows(2).all(|pair| pair[0] > pair[1]),
        "CHANGELOG.md's entries should run newest first: {versions:?}"
    );
    for (version, entry) in releases {
        assert!(
            entry.starts_with('(') && entry.contains("### Upgrading"),
            "CHANGELOG.md's {version} entry should give its date and an Upgrading part"
        );
    }
}
