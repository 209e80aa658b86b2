//! How a settled interaction is worded for a person: the daemon's refusal of a late
//! answer (`FailedPrecondition`) and the client's own message from `GetInteraction` say
//! it the same way, through [`settled_message`].

use crate::error::Error;

/// Milliseconds since the epoch as `2026-11-30 15:35:43 UTC`.
pub fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// How long before `now_ms` the time `ms` was, in its largest unit: `42s`, `3m`, `5h`,
/// `2d` (a time in the future is `0s`).
pub fn ago(ms: i64, now_ms: i64) -> String {
    let s = now_ms.saturating_sub(ms).max(0) / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// `request req_1 (session 0193…) was already allowed by client:x at 2026-11-30 15:35:43
/// UTC (3m ago)`: `state` is the state's name; who and when are left out when unknown
/// (`decided_ms` of 0 or less is unknown); `now_ms` is the clock the age is told by.
pub fn settled_message(
    request_id: &str,
    session_id: &str,
    state: &str,
    decided_by: Option<&str>,
    decided_ms: Option<i64>,
    now_ms: i64,
) -> String {
    let by = match decided_by {
        Some(by) if !by.is_empty() => format!(" by {by}"),
        _ => String::new(),
    };
    let at = match decided_ms {
        Some(ms) if ms > 0 => format!(" at {} ({} ago)", utc(ms), ago(ms, now_ms)),
        _ => String::new(),
    };
    format!("request {request_id} (session {session_id}) was already {state}{by}{at}")
}

/// The refusal of an answer to `i`, decided before (by another client, a rule, expiry):
/// `FailedPrecondition` with [`settled_message`] and who decided (`unknown` when the store
/// does not say).
pub(crate) fn decided_error(i: &ostler_store::Interaction) -> Error {
    let by = i.decided_by.clone().unwrap_or_else(|| "unknown".into());
    Error::FailedPrecondition {
        message: settled_message(
            &i.request_id,
            &i.session_id,
            i.state.as_str(),
            Some(&by),
            i.decided_ms,
            crate::hub::now_ms(),
        ),
        decided_by: Some(by),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_times_in_utc_and_ages() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_868_799_000), "2000-02-29 23:59:59 UTC");
        assert_eq!(utc(1_796_053_543_123), "2026-11-30 15:45:43 UTC");
        assert_eq!(utc(-1), "1969-12-31 23:59:59 UTC");
        assert_eq!(ago(1_000, 60_999), "59s");
        assert_eq!(ago(0, 3_599_999), "59m");
        assert_eq!(ago(0, 7_200_000), "2h");
        assert_eq!(ago(0, 3 * 86_400_000), "3d");
        assert_eq!(ago(5_000, 0), "0s");
        assert_eq!(
            ago(i64::MIN, i64::MAX),
            format!("{}d", i64::MAX / 86_400_000)
        );
    }

    #[test]
    fn settled_says_who_and_when_if_known() {
        let now = 1_796_053_543_123 + 120_000;
        assert_eq!(
            settled_message(
                "req_1",
                "s1",
                "allowed",
                Some("client:phone"),
                Some(1_796_053_543_123),
                now
            ),
            "request req_1 (session s1) was already allowed by client:phone at 2026-11-30 \
             15:45:43 UTC (2m ago)"
        );
        assert_eq!(
            settled_message("r", "s", "expired", None, Some(0), now),
            "request r (session s) was already expired"
        );
        assert_eq!(
            settled_message("r", "s", "denied", Some(""), None, now),
            "request r (session s) was already denied"
        );
    }
}
