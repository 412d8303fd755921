//! How catch-up progress is read without disturbing it: quorumq's `/metrics` and snapshot
//! directory, RabbitMQ's Ra servers through a loop inside node 1 (module doc of `catchup`).

use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{FOLLOWER, LEADER, STALE};
use crate::cluster::Cluster;
use crate::driver::qq_http_address;
use crate::erl_loop::{ErlLoop, rabbit_node};

/// `GET /metrics` of quorumq node `node` (also read by scenario 13, module `priority`).
pub(crate) async fn scrape(node: usize) -> Result<String> {
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(qq_http_address(node)).await?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
            .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        anyhow::Ok(String::from_utf8_lossy(&buf).into_owned())
    };
    let text = tokio::time::timeout(Duration::from_secs(2), fetch)
        .await
        .context("metrics timed out")??;
    let (head, body) = text.split_once("\r\n\r\n").context("no HTTP body")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        bail!("GET /metrics: {}", head.lines().next().unwrap_or_default());
    }
    Ok(body.to_string())
}

/// The value of `metric` for `queue` in a Prometheus text page.
fn metric_of(page: &str, metric: &str, queue: &str) -> Option<u64> {
    let label = format!("queue=\"{queue}\"");
    page.lines()
        .filter(|l| l.starts_with(metric) && l[metric.len()..].starts_with('{'))
        .find(|l| l.contains(&label))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

async fn qq_index(node: usize, metric: &str, queue: &str) -> Option<u64> {
    scrape(node)
        .await
        .ok()
        .and_then(|page| metric_of(&page, metric, queue))
}

/// quorumq: the snapshot files in a node's snapshot directory (`<data_dir>/db/snapshots`), as
/// `(name, bytes)`; `recv-*` are transfers being received.
pub(super) fn qq_snapshot_files(cl: &Cluster, node: usize) -> Vec<(String, u64)> {
    let dir = cl.data_dir(node).join("db").join("snapshots");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let len = e.metadata().ok()?.len();
            Some((e.file_name().to_string_lossy().into_owned(), len))
        })
        .collect()
}

/// The RabbitMQ progress reporter: an [`ErlLoop`] inside node 1 that reads the leader's
/// `commit_index` and node 3's `last_applied` every 200 ms (-1 for what cannot be read, e.g.
/// the follower while it is down).
pub(super) struct Reporter(ErlLoop);

impl Reporter {
    pub(super) fn start(cl: &Cluster, queue: &str, deadline: Duration) -> Result<Reporter> {
        let prelude = format!(
            r#"{{ok, Q}} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"/">>, queue, <<"{queue}">>)),
{{Name, _}} = amqqueue:get_pid(Q),
Get = fun(Node, Key) ->
    case catch sys:get_status({{Name, Node}}, 1000) of
        {{status, _, _, [_, _, _, _, Misc]}} ->
            case lists:keyfind(ra_server_state, 1, Misc) of
                {{_, #{{Key := V}}}} -> V;
                _ -> -1
            end;
        _ -> -1
    end
end,"#
        );
        let step = format!(
            "io_lib:format(\"~b ~b\", [Get('{}', commit_index), Get('{}', last_applied)])",
            rabbit_node(LEADER),
            rabbit_node(FOLLOWER)
        );
        Ok(Reporter(ErlLoop::start(
            cl,
            LEADER,
            "catchup",
            &prelude,
            &step,
            Duration::from_millis(200),
            deadline,
        )?))
    }

    /// The latest `(leader commit index, follower last applied)`, if fresh; -1 is `None`.
    fn read(&self) -> Option<(Option<u64>, Option<u64>)> {
        let v = self.0.read(STALE)?;
        let [commit, applied] = v[..] else {
            return None;
        };
        let known = |x: i64| u64::try_from(x).ok();
        Some((known(commit), known(applied)))
    }

    pub(super) fn ended(&mut self) -> Option<String> {
        self.0.ended()
    }

    pub(super) fn stop(self) {
        self.0.stop()
    }
}

/// Where catch-up progress is read from.
pub(super) enum Watch {
    Qq,
    Rabbit(Reporter),
}

impl Watch {
    pub(super) async fn leader_commit(&self, queue: &str) -> Option<u64> {
        match self {
            Watch::Qq => qq_index(LEADER, "quorumq_raft_commit_index", queue).await,
            Watch::Rabbit(r) => r.read().and_then(|(c, _)| c),
        }
    }

    pub(super) async fn follower_applied(&self, queue: &str) -> Option<u64> {
        match self {
            Watch::Qq => qq_index(FOLLOWER, "quorumq_raft_applied_index", queue).await,
            Watch::Rabbit(r) => r.read().and_then(|(_, a)| a),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_read_by_queue_label() {
        let page = "# HELP quorumq_raft_applied_index x\n\
                    quorumq_raft_applied_index{vhost=\"/\",queue=\"other\"} 7\n\
                    quorumq_raft_applied_index{vhost=\"/\",queue=\"q\"} 12345\n\
                    quorumq_raft_applied_index_x{vhost=\"/\",queue=\"q\"} 1\n";
        assert_eq!(
            metric_of(page, "quorumq_raft_applied_index", "q"),
            Some(12345)
        );
        assert_eq!(metric_of(page, "quorumq_raft_applied_index", "none"), None);
        assert_eq!(metric_of(page, "quorumq_raft_commit_index", "q"), None);
    }
}
