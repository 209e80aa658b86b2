//! Target `interaction`: `GetInteraction` on arbitrary request and session ids, through the
//! real handler, engine and store (a temporary one holding a few interactions), and the
//! store's lookup on its own with the same ids unchecked (empty, huge, NUL, LIKE wildcards,
//! code points around the ends of the UTF-8 ranges). Both are held to a reference model:
//! the exact id wins, else the one id the input is a prefix of; nothing widens the match.

use ostler_proto::v1 as pb;
use ostler_proto::v1::session_service_server::SessionService;
use ostler_store::{
    Decision, InteractionKind, InteractionLookup, InteractionState, NewInteraction, NewSession,
    SessionState, Store,
};
use proptest::prelude::*;
use proptest::sample::{Index, select};
use tonic::{Code, Request};

use crate::{Budget, Failure, Report, drive};

/// Longest error message accepted (as `convert`: errors must not echo large input).
const MAX_MESSAGE: usize = 1024;
/// The edge's limit on an id (`ostler_server` `limits::ID_BYTES`).
const ID_BYTES: usize = 256;
/// How many candidates the store reports for an ambiguous prefix.
const CANDIDATES: usize = 5;

const SESSIONS: &[&str] = &["sa", "sb", "s_"];

/// (session, request id, decided): ids a LIKE pattern or a sloppy upper bound would
/// confuse, and a run of `m` ids (more than [`CANDIDATES`]).
const STORED: &[(&str, &str, bool)] = &[
    ("sa", "dup", true),
    ("sb", "dup", false),
    ("sa", "rx1", true),
    ("sa", "rx2", false),
    ("sa", "a%b", false),
    ("sb", "a_c", true),
    ("sa", "abc", false),
    ("sa", "a\\d", false),
    ("sb", "é1", false),
    ("sb", "\u{FFFF}x", false),
    ("sa", "\u{10FFFF}", true),
    ("sa", "z\u{10FFFF}\u{10FFFF}", false),
    ("sb", "z\u{10FFFF}", false),
    ("sb", "\u{D7FF}1", false),
    ("sb", "\u{E000}1", false),
    ("sa", "x\u{7F}", false),
    ("sb", "X", false),
    ("s_", "toolu_01", true),
    ("s_", "toolu_02", false),
    ("sa", "toolu_1", false),
    ("sa", "m0", false),
    ("sb", "m1", false),
    ("sa", "m2", false),
    ("s_", "m3", false),
    ("sa", "m4", false),
    ("sb", "m5", false),
    ("sa", "m6", false),
];

#[derive(Debug, Clone)]
struct Case {
    request_id: String,
    session_id: String,
}

/// Awkward ids: stored ones, their prefixes and extensions, wildcards, whitespace, NUL,
/// the last code points, and lengths around the edge's limit.
fn id() -> BoxedStrategy<String> {
    let stored = select(STORED).prop_map(|(_, r, _)| r.to_owned());
    let prefix = (select(STORED), any::<Index>()).prop_map(|((_, r, _), i)| {
        let n = i.index(r.chars().count() + 1);
        r.chars().take(n).collect::<String>()
    });
    let extended = (
        select(STORED),
        select(
            &[
                "%",
                "_",
                "\0",
                "\u{10FFFF}",
                "\u{FFFF}",
                "1",
                " ",
                "\\",
                "*",
            ][..],
        ),
    )
        .prop_map(|((_, r, _), tail)| format!("{r}{tail}"));
    let wild = select(
        &[
            "%",
            "_",
            "%%",
            "a%",
            "a_",
            "a_%",
            "%b",
            "_dup",
            "toolu_%",
            "toolu__1",
            "m%",
            "m_",
            "\\",
            "a\\",
            "*",
            "?",
            "[a]",
            "'",
            "\"",
            "' OR 1=1 --",
            "\u{10FFFF}",
            "\u{10FFFF}\u{10FFFF}",
            "z\u{10FFFF}",
            "\u{FFFF}",
            "\u{D7FF}",
            "\u{E000}",
            "x\u{7F}",
            "\u{7F}",
            "é",
            "e\u{301}",
            "\0",
            "dup\0",
            "a\0b",
            " ",
            "\t\n",
            " dup ",
            "DUP",
            "Rx1",
        ][..],
    )
    .prop_map(str::to_owned);
    prop_oneof![
        3 => stored,
        4 => prefix,
        2 => extended,
        3 => wild,
        2 => "\\PC{0,8}",
        1 => ".{0,8}",
        1 => "[\\x00-\\x20%_a]{0,4}",
        1 => (250usize..262).prop_map(|n| "m".repeat(n)),
        1 => (1000usize..70_000).prop_map(|n| "é".repeat(n / 2)),
    ]
    .boxed()
}

fn session() -> BoxedStrategy<String> {
    prop_oneof![
        4 => Just(String::new()),
        4 => select(SESSIONS).prop_map(str::to_owned),
        2 => select(&[" ", " sa ", "s%", "s_x", "S_", "SA", "sa\0", "zz"][..]).prop_map(str::to_owned),
        1 => "\\PC{0,4}",
        1 => (250usize..5000).prop_map(|n| "s".repeat(n)),
    ]
    .boxed()
}

fn case() -> impl Strategy<Value = Case> {
    (id(), session()).prop_map(|(request_id, session_id)| Case {
        request_id,
        session_id,
    })
}

/// What a lookup of `rid` in `sid` (any session: `None`) must come to.
#[derive(Debug, PartialEq, Eq)]
enum Expect {
    Found(&'static str, &'static str),
    NoSuchRequest,
    NoSuchSession,
    /// Exact id in several sessions (their sessions, sorted).
    InSessions(Vec<&'static str>),
    /// Several ids start with it (all of them, sorted by id then session).
    Ambiguous(Vec<&'static str>),
}

fn model(sid: Option<&str>, rid: &str) -> Expect {
    if let Some(s) = sid
        && !SESSIONS.contains(&s)
    {
        return Expect::NoSuchSession;
    }
    // By request id (bytes: SQLite's BINARY order), then session (in creation order).
    let mut matches: Vec<(&'static str, &'static str)> = STORED
        .iter()
        .filter(|(s, r, _)| sid.is_none_or(|x| x == *s) && r.starts_with(rid))
        .map(|(s, r, _)| (*r, *s))
        .collect();
    matches.sort_by_key(|(r, s)| (*r, SESSIONS.iter().position(|x| x == s)));
    let exact: Vec<(&'static str, &'static str)> =
        matches.iter().copied().filter(|(r, _)| *r == rid).collect();
    match (exact.as_slice(), matches.as_slice()) {
        ([(r, s)], _) | ([], [(r, s)]) => Expect::Found(s, r),
        ([], []) => Expect::NoSuchRequest,
        ([], many) => Expect::Ambiguous(many.iter().map(|(r, _)| *r).collect()),
        (several, _) => Expect::InSessions(several.iter().map(|(_, s)| *s).collect()),
    }
}

fn decided(session: &str, request: &str) -> bool {
    STORED
        .iter()
        .any(|(s, r, d)| *s == session && *r == request && *d)
}

struct World {
    rt: tokio::runtime::Runtime,
    svc: ostler_server::SessionSvc,
    store: Store,
    _dir: tempfile::TempDir,
}

fn world() -> Result<World, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
    let store = Store::open(dir.path().join("ostler.db"), Default::default())
        .map_err(|e| format!("store: {e}"))?;
    for (i, id) in SESSIONS.iter().enumerate() {
        store
            .create_session(NewSession {
                id: (*id).into(),
                claude_session_id: None,
                cwd: format!("/w/{id}"),
                model: None,
                permission_mode: None,
                cli_release: None,
                state: SessionState::Stopped,
                labels: Default::default(),
                created_ms: i64::try_from(i).unwrap_or_default(),
            })
            .wait()
            .map_err(|e| format!("session {id}: {e}"))?;
    }
    for (session, request, decide) in STORED {
        store
            .upsert_interaction(NewInteraction {
                session_id: (*session).into(),
                request_id: (*request).into(),
                kind: InteractionKind::Permission,
                tool_name: Some("Bash".into()),
                input: bytes::Bytes::from_static(b"{}"),
                suggestions: None,
                event_seq: None,
                created_ms: 5,
            })
            .wait()
            .map_err(|e| format!("interaction {request:?}: {e}"))?;
        if *decide {
            store
                .decide_interaction(
                    session,
                    request,
                    Decision {
                        state: InteractionState::Allowed,
                        decided_by: "client:fuzz".into(),
                        response: None,
                        decided_ms: 7,
                    },
                )
                .wait()
                .map_err(|e| format!("decide {request:?}: {e}"))?;
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    let installation = ostler_supervisor::Installation::assume(
        "/nonexistent/claude".into(),
        semver::Version::new(2, 1, 330),
        None,
    );
    let engine = rt
        .block_on(ostler_engine::Engine::start(
            Default::default(),
            store.clone(),
            installation,
        ))
        .map_err(|e| format!("engine: {e}"))?;
    let svc = ostler_server::SessionSvc::new(engine, tokio_util::sync::CancellationToken::new());
    Ok(World {
        rt,
        svc,
        store,
        _dir: dir,
    })
}

/// The store's lookup, unchecked input: the model's answer, never a panic.
fn check_store(w: &World, c: &Case) -> Result<(), TestCaseError> {
    let sid = (!c.session_id.is_empty()).then_some(c.session_id.as_str());
    let rid = c.request_id.as_str();
    let got = w.store.lookup_interaction(sid, rid);
    if rid.is_empty() {
        prop_assert!(
            matches!(got, Err(ostler_store::Error::InvalidArgument(_))),
            "empty id: {got:?}"
        );
        return Ok(());
    }
    let found = |i: &ostler_store::Interaction| (i.session_id.clone(), i.request_id.clone());
    match (model(sid, rid), got) {
        (Expect::NoSuchSession, Err(ostler_store::Error::NotFound { .. })) => {}
        (Expect::NoSuchRequest, Ok(InteractionLookup::NotFound)) => {}
        (Expect::Found(s, r), Ok(InteractionLookup::Found(i))) => {
            prop_assert_eq!(found(&i), (s.to_owned(), r.to_owned()));
            let state = if decided(s, r) {
                InteractionState::Allowed
            } else {
                InteractionState::Pending
            };
            prop_assert_eq!(i.state, state);
        }
        (Expect::InSessions(sessions), Ok(InteractionLookup::InSessions(c))) => {
            let got: Vec<&str> = c.iter().map(|i| i.session_id.as_str()).collect();
            prop_assert_eq!(got, sessions);
            prop_assert!(c.iter().all(|i| i.request_id == rid));
        }
        (Expect::Ambiguous(ids), Ok(InteractionLookup::Ambiguous { candidates, more })) => {
            let got: Vec<&str> = candidates.iter().map(|i| i.request_id.as_str()).collect();
            let want: Vec<&str> = ids.iter().take(CANDIDATES).copied().collect();
            prop_assert_eq!(got, want);
            prop_assert_eq!(more, ids.len() > CANDIDATES);
        }
        (want, got) => {
            return Err(TestCaseError::fail(format!(
                "store lookup of {} in {}: expected {want:?}, got {}",
                crate::clip(format!("{rid:?}"), 300),
                crate::clip(format!("{sid:?}"), 300),
                crate::clip(format!("{got:?}"), 1000),
            )));
        }
    }
    Ok(())
}

/// The edge's view of an id field: the value it goes on with, or the field it refuses.
fn edge_id(raw: &str) -> Option<&str> {
    (raw.len() <= ID_BYTES && !raw.contains('\0') && !raw.trim().is_empty()).then(|| raw.trim())
}

/// `GetInteraction` through the handler: the model's answer, or NOT_FOUND / INVALID_ARGUMENT
/// with a short message naming the field.
fn check_rpc(w: &World, c: &Case) -> Result<(), TestCaseError> {
    let req = pb::GetInteractionRequest {
        request_id: c.request_id.clone(),
        session_id: c.session_id.clone(),
    };
    let got =
        w.rt.block_on(SessionService::get_interaction(&w.svc, Request::new(req)))
            .map(tonic::Response::into_inner);
    // (code, what the message names) or the interaction.
    let want: Result<(&str, &str), (Code, &str)> = match edge_id(&c.request_id) {
        None => Err((Code::InvalidArgument, "request_id")),
        Some(rid) => {
            let sid = match c.session_id.trim() {
                "" => Ok(None),
                _ => edge_id(&c.session_id)
                    .map(Some)
                    .ok_or((Code::InvalidArgument, "session_id")),
            };
            match sid {
                Err(e) => Err(e),
                Ok(sid) => match model(sid, rid) {
                    Expect::Found(s, r) => Ok((s, r)),
                    Expect::NoSuchRequest => Err((Code::NotFound, "request")),
                    Expect::NoSuchSession => Err((Code::NotFound, "session")),
                    Expect::InSessions(_) | Expect::Ambiguous(_) => {
                        Err((Code::InvalidArgument, "request_id"))
                    }
                },
            }
        }
    };
    match (want, got) {
        (Ok((s, r)), Ok(i)) => {
            prop_assert_eq!((i.session_id.as_str(), i.request_id.as_str()), (s, r));
            prop_assert_eq!(i.cwd, format!("/w/{s}"));
            let state = if decided(s, r) {
                pb::InteractionState::Allowed
            } else {
                pb::InteractionState::Pending
            };
            prop_assert_eq!(i.state, state as i32);
        }
        (Err((code, names)), Err(status)) => {
            let m = status.message();
            prop_assert_eq!(status.code(), code, "{}", crate::clip(m.to_owned(), 300));
            prop_assert!(
                m.len() <= MAX_MESSAGE,
                "error message of {} bytes (input echoed?): {}",
                m.len(),
                crate::clip(m.to_owned(), 300)
            );
            prop_assert!(
                m.contains(names),
                "{:?} does not name {names}",
                crate::clip(m.to_owned(), 300)
            );
        }
        (want, got) => {
            return Err(TestCaseError::fail(format!(
                "GetInteraction: expected {want:?}, got {:?}",
                got.map(|i| (i.session_id, i.request_id))
                    .map_err(|s| (s.code(), crate::clip(s.message().to_owned(), 300)))
            )));
        }
    }
    Ok(())
}

/// Runs the interaction target until the budget's deadline.
pub fn interaction(budget: Budget) -> Result<Report, Failure> {
    let w = world().map_err(|reason| Failure {
        target: "interaction",
        seed: budget.seed.unwrap_or(crate::Seed([0; 32])),
        reason: format!("setting up the store and engine: {reason}"),
        input: String::new(),
    })?;
    drive("interaction", budget, case(), |c| {
        check_store(&w, &c)?;
        check_rpc(&w, &c)
    })
}
