//! Target `permission`: the rule parser and rule evaluation.

use std::path::{Component, Path};

use ostler_engine::permission::{evaluate, normalize_path};
use ostler_engine::{PermissionRule, RuleAction};
use proptest::prelude::*;
use proptest::sample::select;
use serde_json::json;

use crate::{Budget, Failure, Report, drive};

/// The operators after which an allow rule must never match a Bash command.
const COMPOUND: &[&str] = &["&&", "||", ";", "|", "&", "`", "$(", ">", "<", "\n", "\r"];

#[derive(Debug, Clone)]
struct Case {
    rules: Vec<(bool, String)>,
    tool: String,
    /// Bash command or file path, depending on `tool`.
    arg: String,
    cwd: String,
}

fn spec() -> impl Strategy<Value = String> {
    let tool = prop_oneof![
        select(
            &[
                "Bash",
                "Edit",
                "Read",
                "Write",
                "mcp__srv__*",
                "*",
                "Bash*",
                " Read "
            ][..]
        )
        .prop_map(str::to_owned),
        "[A-Za-z_*() \t]{0,10}",
    ];
    let pattern = prop_oneof![
        select(
            &[
                "git status",
                "git:*",
                "npm *",
                "src/**",
                "**/*.rs",
                "./a/../b",
                "/etc/*",
                "?",
                "",
                " ",
                "*",
                "**",
                "a(b)",
                "((",
                ")",
            ][..]
        )
        .prop_map(str::to_owned),
        "\\PC{0,20}",
    ];
    prop_oneof![
        1 => "\\PC{0,24}",
        3 => (tool, prop::option::of(pattern), select(&["", " ", ")", "\t"][..])).prop_map(
            |(t, p, tail)| match p {
                Some(p) => format!("{t}({p}){tail}"),
                None => format!("{t}{tail}"),
            }
        ),
    ]
}

fn words(list: &'static [&'static str], sep: &'static str) -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![3 => select(list).prop_map(str::to_owned), 1 => "\\PC{0,4}"],
        0..8,
    )
    .prop_map(move |w| w.join(sep))
}

fn case() -> impl Strategy<Value = Case> {
    let command = words(
        &[
            "git", "status", "-s", "&&", "|", "||", ";", "&", "rm", "-rf", "$(", ")", "`", ">",
            "<", "\n", "sudo", "FOO=1", "(", "{", "npm", "statusx", "\r",
        ],
        " ",
    );
    let path = words(
        &[
            "..", ".", "a", "b", "src", "**", "", "secrets", "x.rs", "etc", "é",
        ],
        "/",
    );
    (
        prop::collection::vec((any::<bool>(), spec()), 0..5),
        prop_oneof![
            select(&["Bash", "Edit", "Read", "mcp__srv__x", ""][..]).prop_map(str::to_owned),
            "\\PC{0,8}",
        ],
        prop_oneof![command, path],
        prop_oneof![
            select(
                &[
                    "/",
                    "/work",
                    "/work/a/..",
                    "relative",
                    "",
                    "/tmp/./x",
                    "/.."
                ][..]
            )
            .prop_map(str::to_owned),
            "\\PC{0,12}",
        ],
    )
        .prop_map(|(rules, tool, arg, cwd)| Case {
            rules,
            tool,
            arg,
            cwd,
        })
}

fn action(deny: bool) -> RuleAction {
    if deny {
        RuleAction::Deny
    } else {
        RuleAction::Allow
    }
}

fn check(c: Case) -> Result<(), TestCaseError> {
    let mut rules: Vec<PermissionRule> = Vec::new();
    for (deny, spec) in &c.rules {
        let a = action(*deny);
        let Ok(rule) = PermissionRule::parse(a, spec) else {
            continue;
        };
        prop_assert!(rule.validate().is_ok(), "parsed rule does not validate");
        prop_assert_eq!(rule.action, a);
        // parse -> text -> parse is stable.
        let text = rule.text();
        let prefix = format!("{} ", a.as_str());
        let Some(back) = text.strip_prefix(&prefix) else {
            return Err(TestCaseError::fail(format!(
                "{text:?} does not start with {prefix:?}"
            )));
        };
        let again = PermissionRule::parse(a, back)
            .map_err(|e| TestCaseError::fail(format!("{text:?} does not parse again: {e}")))?;
        prop_assert_eq!(&again, &rule);
        rules.push(rule);
    }

    let cwd = Path::new(&c.cwd);
    if let Some(n) = normalize_path(Path::new(&c.arg)) {
        prop_assert!(
            n.components()
                .all(|k| !matches!(k, Component::ParentDir | Component::CurDir)),
            "normalised path {n:?} keeps . or .."
        );
    }
    for input in [
        json!({ "command": c.arg }),
        json!({ "file_path": c.arg }),
        json!({ "path": c.arg, "notebook_path": c.cwd }),
        json!({ "command": 1, "file_path": null }),
    ] {
        let matching: Vec<&PermissionRule> = rules
            .iter()
            .filter(|r| r.matches(&c.tool, &input, cwd))
            .collect();
        let decision = evaluate(&rules, &c.tool, &input, cwd);
        let expected = if matching.iter().any(|r| r.action == RuleAction::Deny) {
            Some(RuleAction::Deny)
        } else if matching.is_empty() {
            None
        } else {
            Some(RuleAction::Allow)
        };
        prop_assert_eq!(
            decision.as_ref().map(|d| d.action),
            expected,
            "deny must win"
        );
        if c.tool == "Bash"
            && let Some(cmd) = input.get("command").and_then(|v| v.as_str())
            && COMPOUND.iter().any(|op| cmd.contains(op))
        {
            for r in &matching {
                prop_assert!(
                    r.action == RuleAction::Deny || r.pattern.is_none(),
                    "allow rule {} matches the compound command {cmd:?}",
                    r.text()
                );
            }
        }
    }
    Ok(())
}

/// Runs the permission target until the budget's deadline.
pub fn permission(budget: Budget) -> Result<Report, Failure> {
    drive("permission", budget, case(), check)
}
