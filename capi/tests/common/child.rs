//! Child processes of a test: the test binary run again on one test, with an
//! environment variable telling it its role; the parent reads what it prints.

use std::io::{BufRead, BufReader, Lines};
use std::process::{Child, ChildStdout, Command, Stdio};

pub type Said = Lines<BufReader<ChildStdout>>;

/// Runs `test` of this binary again in a child with `var=value`, its stdout piped
/// (and its stdin too, for a parent that tells it when to go on).
pub fn spawn(test: &str, var: &str, value: &str) -> (Child, Said) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(var, value)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, lines)
}

/// The next line of the child's that holds `tag`, from `tag` on.
pub fn line_of(lines: &mut Said, tag: &str) -> String {
    let mut seen = Vec::new();
    for l in lines.map_while(Result::ok) {
        // The child's libtest prints its own "test name ... " before it on the same line.
        if let Some(at) = l.find(tag) {
            return l[at..].to_string();
        }
        seen.push(l);
    }
    panic!("the child said no {tag}; it said {seen:?}")
}

/// `key=<number>` in `line`.
pub fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
        .parse()
        .unwrap()
}
