//! The shipped alert rules (deploy/prometheus/) pass `promtool check rules` and their unit
//! tests (`promtool test rules`), with Debian's promtool; fails loudly without it.
use std::{path::PathBuf, process::Command};

fn deploy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus")
}

fn promtool(args: &[&str]) -> String {
    let output = Command::new("promtool")
        .args(args)
        .current_dir(deploy())
        .output()
        .expect("promtool is not installed (apt-get install prometheus; .ci/run does)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn the_alert_rules_are_valid() {
    let text = promtool(&["check", "rules", "alerts.yaml"]);
    assert!(text.contains("SUCCESS: 4 rules found"), "{text}");
}

#[test]
fn the_alert_rules_pass_their_unit_tests() {
    let text = promtool(&["test", "rules", "alerts_test.yaml"]);
    assert!(text.contains("SUCCESS"), "{text}");
}
