//! At-most-once dead letters dropped, logged at most once a second per queue.

use std::time::Duration;

use qq_raft::GroupId;
use tokio::time::Instant;
use tracing::warn;

use crate::groups::queue_sm::LEADER_EVENTS_BOUND;

/// Lines about dropped dead letters: at most one per [`DROP_LOG_EVERY`] per queue.
const DROP_LOG_EVERY: Duration = Duration::from_secs(1);

/// At-most-once dead letters dropped (their republish failed, or the actor's inbox was full),
/// logged rate-limited: a line says how many were dropped since the previous one.
pub(super) struct DropLog {
    /// Not yet logged.
    pub(super) pending: u64,
    /// The latest reason a republish gave.
    latest: Option<String>,
    last_line: Option<Instant>,
    /// The machine's inbox-drop count already taken into `pending`.
    inbox_seen: u64,
}

impl DropLog {
    pub(super) fn new(inbox_seen: u64) -> DropLog {
        DropLog {
            pending: 0,
            latest: None,
            last_line: None,
            inbox_seen,
        }
    }

    pub(super) fn dropped(&mut self, n: u64, why: String) {
        self.pending += n;
        self.latest = Some(why);
    }

    pub(super) fn count_inbox_drops(&mut self, total: u64) {
        let new = total.saturating_sub(self.inbox_seen);
        self.inbox_seen = total;
        if new > 0 {
            self.dropped(
                new,
                format!("the leader's queue of dead letters was full ({LEADER_EVENTS_BOUND})"),
            );
        }
    }

    /// Log the drops if a line is due at `now`.
    pub(super) fn log_if_due(&mut self, group: GroupId, now: Instant) {
        if let Some((dropped, latest)) = self.take_due(now) {
            warn!(
                group,
                dropped,
                "at-most-once dead letters dropped: {dropped} since the last such line (latest: {latest})"
            );
        }
    }

    /// The count and latest reason to log at `now`, if a line is due: something was dropped
    /// and the previous line is at least [`DROP_LOG_EVERY`] old.
    fn take_due(&mut self, now: Instant) -> Option<(u64, String)> {
        if self.pending == 0
            || self
                .last_line
                .is_some_and(|t| now.saturating_duration_since(t) < DROP_LOG_EVERY)
        {
            return None;
        }
        self.last_line = Some(now);
        let latest = self.latest.take().unwrap_or_else(|| "unknown".into());
        Some((std::mem::take(&mut self.pending), latest))
    }
}

#[cfg(test)]
mod drop_log_tests {
    use super::*;

    #[test]
    fn drops_are_logged_at_most_once_a_second_with_their_count() {
        let t0 = Instant::now();
        let mut log = DropLog::new(10);
        assert_eq!(log.take_due(t0), None, "nothing dropped, nothing to say");
        log.dropped(1, "no route".into());
        assert_eq!(log.take_due(t0), Some((1, "no route".into())));
        // Within the second: counted, not logged.
        for _ in 0..5 {
            log.dropped(1, "no route".into());
        }
        log.count_inbox_drops(13); // 3 more, dropped at the full inbox (10 seen before)
        assert_eq!(log.take_due(t0 + Duration::from_millis(999)), None);
        let (n, why) = log
            .take_due(t0 + DROP_LOG_EVERY)
            .expect("a line after a second");
        assert_eq!(n, 8);
        assert!(why.contains("full"), "{why}");
        log.count_inbox_drops(13);
        assert_eq!(log.take_due(t0 + 3 * DROP_LOG_EVERY), None, "nothing new");
    }
}
