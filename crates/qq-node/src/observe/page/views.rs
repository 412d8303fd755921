//! The views of the management page, as HTML bodies from data the handlers gathered
//! ([`super`]). Pure functions: no I/O, every user string through [`esc`].

use std::collections::BTreeMap;
use std::fmt::Write;

use qq_core::meta::QueueMeta;
use qq_core::policy::{self, Policy, SettingSource};
use qq_core::{QueueConfig, Value};
use qq_proto::v1 as pb;

use super::html::{bytes, esc, href, link, table, tag, value};
use super::rates::Rate;
use crate::groups::registry::QueueInfoData;

/// The login form; `error` says why the last attempt failed.
pub fn login(error: Option<&str>, user: &str) -> String {
    let mut out = String::from("<div class=\"login\">");
    if let Some(e) = error {
        let _ = write!(out, "<p id=\"error\" class=\"bad\">{}</p>", esc(e));
    }
    let _ = write!(
        out,
        "<form method=\"post\" action=\"/login\">\
         <label for=\"username\">User</label>\
         <input id=\"username\" name=\"username\" autocomplete=\"username\" value=\"{}\" required>\
         <label for=\"password\">Password</label>\
         <input id=\"password\" name=\"password\" type=\"password\" autocomplete=\"current-password\">\
         <button id=\"login\" type=\"submit\">Log in</button></form>\
         <p class=\"note\">The broker's users, as for the gRPC API (users in loopback_users only from \
         this host).</p></div>",
        esc(user)
    );
    out
}

/// What the overview shows.
pub struct Overview<'a> {
    pub node_id: u64,
    pub serving: bool,
    pub status: &'a pb::ClusterStatusResponse,
    pub totals: &'a pb::OverviewResponse,
}

pub fn overview(o: &Overview<'_>) -> String {
    let s = o.status;
    let mut out = String::new();
    let health = if o.serving {
        "<span id=\"health\" class=\"ok\">SERVING</span>"
    } else {
        "<span id=\"health\" class=\"bad\">NOT_SERVING</span>"
    };
    let alarms = if s.alarms.is_empty() {
        "<span id=\"alarms\" class=\"ok\">none</span>".to_string()
    } else {
        format!(
            "<span id=\"alarms\" class=\"bad\">{}</span> (publishes are refused while an alarm \
             is on)",
            esc(&s.alarms.join(", "))
        )
    };
    let metadata_leader = if s.metadata_leader == 0 {
        "unknown".to_string()
    } else {
        format!("node {}", s.metadata_leader)
    };
    let _ = write!(
        out,
        "<p>This page is served by node {}: health {health}; alarms on this node: {alarms}; \
         metadata leader: {metadata_leader}.</p>",
        o.node_id
    );
    // Leaders per node, over the queues this user may see.
    let mut leaders: BTreeMap<u64, u64> = BTreeMap::new();
    let mut unknown = 0;
    for q in &s.queues {
        if q.leader == 0 {
            unknown += 1;
        } else {
            *leaders.entry(q.leader).or_default() += 1;
        }
    }
    out.push_str(
        "<h2>Nodes</h2><table id=\"nodes\"><tr><th>Node</th><th>Address</th><th>Reachable \
         from this node</th><th>Version</th><th>Queue leaders</th><th>Role</th></tr>",
    );
    for n in &s.nodes {
        let reachable = if n.reachable {
            "<span class=\"ok\">yes</span>"
        } else {
            "<span class=\"bad\">no</span>"
        };
        let mut role = Vec::new();
        if n.id == o.node_id {
            role.push("this node");
        }
        if n.id == s.metadata_leader {
            role.push("metadata leader");
        }
        let _ = write!(
            out,
            "<tr data-node=\"{}\"><td>{}</td><td>{}</td><td>{reachable}</td><td>{}</td>\
             <td class=\"n\">{}</td><td>{}</td></tr>",
            n.id,
            n.id,
            esc(&n.address),
            esc(&n.version),
            leaders.get(&n.id).copied().unwrap_or(0),
            role.join(", ")
        );
    }
    out.push_str("</table>");
    if unknown > 0 {
        let _ = write!(
            out,
            "<p class=\"bad\">{unknown} queue(s) without a known leader on this node.</p>"
        );
    }
    let t = o.totals;
    let _ = write!(
        out,
        "<h2>Totals</h2><p class=\"note\">Over the queues of the virtual hosts you may see.</p>\
         <table id=\"totals\"><tr><th>Queues</th><th>Messages</th><th>Ready</th><th>Unacked</th>\
         <th>Consumers</th><th>Dead letters confirmed (at-least-once)</th></tr><tr>\
         <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
         <td class=\"n\">{}</td><td class=\"n\">{}</td></tr></table>",
        t.queues,
        t.messages,
        t.messages_ready,
        t.messages_unacked,
        t.consumers,
        t.messages_dead_lettered_confirmed_total
    );
    out.push_str(
        "<h2>Dead-lettered</h2><table id=\"dead-lettered\"><tr><th>Reason</th><th>Strategy</th>\
         <th>Messages</th></tr>",
    );
    let mut any = false;
    for d in t
        .messages_dead_lettered_total
        .iter()
        .filter(|d| d.count > 0)
    {
        any = true;
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td></tr>",
            esc(&d.reason),
            esc(&d.strategy),
            d.count
        );
    }
    if !any {
        out.push_str("<tr><td colspan=\"3\">none</td></tr>");
    }
    out.push_str("</table>");
    out
}

/// The effective value of `key` (one of [`policy::SETTING_KEYS`]) in `c`, as text, and
/// whether it is set (a feature worth a tag).
pub fn effective_setting(c: &QueueConfig, key: &str) -> (String, bool) {
    let opt_ms = |v: Option<u64>| {
        v.map_or(("not set".to_string(), false), |n| {
            (format!("{n} ms"), true)
        })
    };
    let opt = |v: Option<u64>| v.map_or(("not set".to_string(), false), |n| (n.to_string(), true));
    match key {
        "dead-letter-exchange" => match &c.dead_letter_exchange {
            Some(x) if x.is_empty() => ("\"\" (the default exchange)".into(), true),
            Some(x) => (x.clone(), true),
            None => ("not set".into(), false),
        },
        "dead-letter-routing-key" => match &c.dead_letter_routing_key {
            Some(k) => (k.clone(), true),
            None => ("not set (each message's own keys)".into(), false),
        },
        "dead-letter-strategy" => (
            c.dead_letter_strategy.as_str().to_string(),
            c.dead_letter_exchange.is_some(),
        ),
        "message-ttl" => opt_ms(c.message_ttl_ms),
        "expires" => opt_ms(c.expires_ms),
        "max-length" => opt(c.max_length),
        "max-length-bytes" => opt(c.max_length_bytes),
        "overflow" => (policy::overflow_name(c.overflow).to_string(), true),
        "delivery-limit" => match c.delivery_limit {
            Some(n) => (n.to_string(), true),
            None => ("unlimited".into(), true),
        },
        "requeue-delays" => {
            if c.requeue_delays_ms.is_empty() {
                ("none (requeue at once)".into(), false)
            } else {
                let ms: Vec<String> = c
                    .requeue_delays_ms
                    .iter()
                    .map(|d| format!("{d} ms"))
                    .collect();
                (ms.join(", "), true)
            }
        }
        "single-active-consumer" => (
            c.single_active_consumer.to_string(),
            c.single_active_consumer,
        ),
        _ => (String::new(), false),
    }
}

/// The short name of a feature tag, as RabbitMQ's management UI (None: no tag).
fn tag_name(key: &str) -> Option<&'static str> {
    Some(match key {
        "dead-letter-exchange" => "DLX",
        "dead-letter-routing-key" => "DLK",
        "dead-letter-strategy" => "DLS",
        "message-ttl" => "TTL",
        "expires" => "Exp",
        "max-length" => "Lim",
        "max-length-bytes" => "Lim B",
        "delivery-limit" => "D-Lim",
        "requeue-delays" => "Delays",
        "single-active-consumer" => "SAC",
        "overflow" => "Ovfl",
        _ => return None,
    })
}

/// Who set a setting, in words.
fn source_text(source: SettingSource, policy_name: Option<&str>) -> String {
    let p = policy_name.unwrap_or("?");
    match source {
        SettingSource::Default => "default".into(),
        SettingSource::Argument => "argument".into(),
        SettingSource::Policy => format!("policy {p}"),
        SettingSource::Both => format!("argument and policy {p} (equal)"),
    }
}

/// The feature tags of a queue: each setting given by an argument or a policy that is in
/// effect, then its policy's name and its operator policy's (with the limits it imposes).
pub fn feature_tags(q: &QueueMeta, policy: Option<&Policy>, operator: Option<&Policy>) -> String {
    let mut out = String::new();
    for (key, source) in policy::setting_sources(&q.arguments, policy) {
        if source == SettingSource::Default {
            continue;
        }
        let (shown, set) = effective_setting(&q.config, key);
        if !set {
            continue;
        }
        if let Some(name) = tag_name(key) {
            let title = format!(
                "{key}: {shown} ({})",
                source_text(source, policy.map(|p| p.name.as_str()))
            );
            out.push_str(&tag(name, &title));
            out.push(' ');
        }
    }
    // The consumer timeout lives outside the queue's config (its machine has it since
    // version 2): tagged from the argument and the policy.
    if let Some(t) = policy::consumer_timeout_ms(&q.arguments, policy) {
        out.push_str(&tag("CT", &format!("consumer-timeout: {t} ms")));
        out.push(' ');
    }
    if let Some(max) = policy::max_priority(&q.arguments) {
        let title = format!("x-max-priority: {max} (strict levels 0-{max})");
        out.push_str(&tag("Pri", &title));
        out.push(' ');
    }
    if let Some(p) = &q.config.policy {
        out.push_str(&tag(&format!("Pol {p}"), &format!("policy {p}")));
        out.push(' ');
    }
    if let Some(op) = operator {
        let limits: Vec<String> = op
            .definition
            .iter()
            .map(|(k, v)| format!("{k} {}", v.as_i64().unwrap_or_default()))
            .collect();
        let title = format!(
            "operator policy {}: {} (the stricter of these and the queue's own wins)",
            op.name,
            limits.join(", ")
        );
        out.push_str(&tag(&format!("Op {}", op.name), &title));
    }
    out.trim_end().to_string()
}

/// One row of the queues table.
pub struct QueueRow<'a> {
    pub meta: &'a QueueMeta,
    pub policy: Option<&'a Policy>,
    pub operator: Option<&'a Policy>,
    pub info: Option<&'a QueueInfoData>,
    pub rate: Option<Rate>,
}

fn queue_type(q: &QueueMeta) -> String {
    q.arguments
        .get("x-queue-type")
        .and_then(Value::as_str)
        .unwrap_or("quorum")
        .to_string()
}

fn members(m: &[u64]) -> String {
    m.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
}

pub fn queues(vhost: &str, rows: &[QueueRow<'_>]) -> String {
    let mut out = String::new();
    if rows.is_empty() {
        let _ = write!(out, "<p>No queues in virtual host {}.</p>", esc(vhost));
    }
    out.push_str(
        "<table id=\"queues\"><tr><th>Name</th><th>Type</th><th>Features</th><th>Ready</th>\
         <th>Unacked</th><th>Held dead letters</th><th>Delayed</th><th>Total</th>\
         <th>Consumers</th><th>Incoming /s</th><th>Deliver /s</th><th>Leader</th><th>Members</th></tr>",
    );
    for r in rows {
        let q = r.meta;
        let _ = write!(
            out,
            "<tr data-queue=\"{}\"><td>{}</td><td>{}</td><td class=\"features\">{}</td>",
            esc(&q.name),
            link("/queue", &[("vhost", &q.vhost), ("name", &q.name)], &q.name),
            esc(&queue_type(q)),
            feature_tags(q, r.policy, r.operator)
        );
        match r.info {
            Some(d) => {
                let c = &d.counts;
                let rate = |v: Option<f64>| v.map_or("&ndash;".to_string(), |x| format!("{x:.1}"));
                let _ = write!(
                    out,
                    "<td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
                     <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
                     <td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td>",
                    c.ready,
                    c.unacked,
                    c.held,
                    c.delayed,
                    c.ready + c.unacked + c.held + c.delayed,
                    c.consumers,
                    rate(r.rate.map(|x| x.publish)),
                    rate(r.rate.map(|x| x.deliver)),
                    d.leader
                );
            }
            None => out.push_str(
                "<td colspan=\"9\" class=\"bad\">its leader did not answer this node</td>",
            ),
        }
        let _ = write!(out, "<td>{}</td></tr>", members(&q.members));
    }
    out.push_str(
        "</table><p class=\"note\">Rates are messages per second between this node's two most \
         recent views of the queue at least 1 s apart (&ndash; until there are two).</p>",
    );
    out
}

/// The `x-death` summary of the first messages of a queue.
#[derive(Default)]
pub struct DeathCounts {
    /// Messages looked at.
    pub scanned: u64,
    /// Ready messages in the queue when it was read.
    pub ready: u64,
    /// (reason, queue it died in) → (messages with such an entry, deaths: the sum of counts).
    pub by_reason: BTreeMap<(String, String), (u64, u64)>,
    /// The latest `reason-detail` a consumer gave → messages.
    pub details: BTreeMap<String, u64>,
    /// Messages whose detail was not counted because `details` was full.
    pub details_other: u64,
}

/// What one queue's page shows besides its metadata and live information.
pub struct QueueView<'a> {
    pub meta: &'a QueueMeta,
    pub policy: Option<&'a Policy>,
    pub operator: Option<&'a Policy>,
    pub info: &'a QueueInfoData,
    /// Where a dead letter of this queue goes, in words (already escaped HTML).
    pub target: String,
    /// The x-death summary, or why there is none.
    pub deaths: Result<DeathCounts, String>,
    pub scan_limit: u64,
}

pub fn queue(v: &QueueView<'_>) -> String {
    let q = v.meta;
    let d = v.info;
    let c = &d.counts;
    let mut out = String::new();
    let _ = write!(
        out,
        "<p>{}</p><table id=\"summary\">\
         <tr><th>Virtual host</th><td>{}</td></tr><tr><th>Type</th><td>{}</td></tr>\
         <tr><th>Leader</th><td>node {}</td></tr><tr><th>Members</th><td>{}</td></tr>\
         <tr><th>Ready</th><td class=\"n\">{} ({})</td></tr><tr><th>Unacked</th><td class=\"n\">{}</td></tr>\
         <tr><th>Held dead letters</th><td class=\"n\">{} ({})</td></tr>\
         <tr><th>Delayed</th><td class=\"n\">{}</td></tr><tr><th>Consumers</th><td class=\"n\">{}</td></tr>\
         <tr><th>Published / delivered / acked (total)</th><td class=\"n\">{} / {} / {}</td></tr>\
         <tr><th>Policy</th><td>{}</td></tr></table>",
        feature_tags(q, v.policy, v.operator),
        esc(&q.vhost),
        esc(&queue_type(q)),
        d.leader,
        members(&q.members),
        c.ready,
        bytes(c.ready_bytes),
        c.unacked,
        c.held,
        bytes(c.held_bytes),
        c.delayed,
        c.consumers,
        d.stats.enqueued_total,
        d.stats.delivered_total,
        d.stats.acked_total,
        q.config.policy.as_deref().map_or("none".to_string(), esc),
    );
    if let Some(note) = &q.config.note {
        let _ = write!(out, "<p class=\"bad\" id=\"note\">{}</p>", esc(note));
    }
    out.push_str(
        "<h2>Effective settings</h2><table id=\"settings\"><tr><th>Setting</th><th>Value</th>\
         <th>Set by</th></tr>",
    );
    let policy_name = v.policy.map(|p| p.name.as_str());
    for (key, source) in policy::setting_sources(&q.arguments, v.policy) {
        let (shown, _) = effective_setting(&q.config, key);
        let _ = write!(
            out,
            "<tr data-setting=\"{key}\"><td>{key}</td><td>{}</td><td>{}</td></tr>",
            esc(&shown),
            esc(&source_text(source, policy_name))
        );
    }
    out.push_str("</table>");
    let _ = write!(
        out,
        "<h2>Dead-letter target</h2><div id=\"dead-letter-target\">{}</div>",
        v.target
    );
    let _ = write!(
        out,
        "<h2>Dead-letter reasons (x-death)</h2><div id=\"x-death\">"
    );
    match &v.deaths {
        Err(why) => {
            let _ = write!(out, "<p class=\"note\">{}</p>", esc(why));
        }
        Ok(dc) => {
            let _ = write!(
                out,
                "<p class=\"note\">Counted over the first {} ready messages (at most {}) of {} \
                 ready.</p>",
                dc.scanned, v.scan_limit, dc.ready
            );
            out.push_str(
                "<table id=\"x-death-reasons\"><tr><th>Reason</th><th>Died in queue</th>\
                 <th>Messages</th><th>Deaths</th></tr>",
            );
            if dc.by_reason.is_empty() {
                out.push_str("<tr><td colspan=\"4\">no message with an x-death history</td></tr>");
            }
            for ((reason, queue), (messages, deaths)) in &dc.by_reason {
                let _ = write!(
                    out,
                    "<tr data-reason=\"{}\"><td>{}</td><td>{}</td><td class=\"n\">{messages}</td>\
                     <td class=\"n\">{deaths}</td></tr>",
                    esc(reason),
                    esc(reason),
                    esc(queue)
                );
            }
            out.push_str("</table>");
            if !dc.details.is_empty() {
                out.push_str(
                    "<table id=\"x-death-details\"><tr><th>Latest reason detail</th>\
                     <th>Messages</th></tr>",
                );
                for (detail, n) in &dc.details {
                    let _ = write!(
                        out,
                        "<tr><td>{}</td><td class=\"n\">{n}</td></tr>",
                        esc(detail)
                    );
                }
                if dc.details_other > 0 {
                    let _ = write!(
                        out,
                        "<tr><td>(other details)</td><td class=\"n\">{}</td></tr>",
                        dc.details_other
                    );
                }
                out.push_str("</table>");
            }
        }
    }
    out.push_str("</div>");
    let _ = write!(
        out,
        "<h2>Arguments</h2><table id=\"arguments\"><tr><th>Argument</th><th>Value</th></tr>"
    );
    for (k, val) in &q.arguments {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td></tr>",
            esc(k),
            esc(&value(val))
        );
    }
    if q.arguments.is_empty() {
        out.push_str("<tr><td colspan=\"2\">none</td></tr>");
    }
    out.push_str("</table>");
    out
}

/// A wire table as text (not escaped).
fn pb_table(t: &std::collections::HashMap<String, pb::Value>) -> String {
    match crate::api::convert::table_from_pb("arguments", t) {
        Ok(t) => table(&t),
        Err(e) => format!("({})", e.message()),
    }
}

pub fn exchanges(vhost: &str, xs: &[pb::ExchangeInfo]) -> String {
    let mut out = String::from(
        "<table id=\"exchanges\"><tr><th>Name</th><th>Type</th><th>Durable</th>\
         <th>Auto-delete</th><th>Internal</th><th>Arguments</th></tr>",
    );
    let mut xs: Vec<&pb::ExchangeInfo> = xs.iter().collect();
    xs.sort_by(|a, b| a.name.cmp(&b.name));
    for x in xs {
        let name = if x.name.is_empty() {
            "(default)".to_string()
        } else {
            x.name.clone()
        };
        let _ = write!(
            out,
            "<tr data-exchange=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&x.name),
            link(
                "/bindings",
                &[("vhost", vhost), ("exchange", &x.name)],
                &name
            ),
            esc(&x.r#type),
            x.durable,
            x.auto_delete,
            x.internal,
            esc(&pb_table(&x.arguments))
        );
    }
    out.push_str("</table>");
    out
}

pub fn bindings(vhost: &str, bs: &[pb::BindingInfo], exchange: Option<&str>) -> String {
    let mut out = String::new();
    if let Some(x) = exchange {
        let _ = write!(
            out,
            "<p>From exchange {} only ({}).</p>",
            esc(x),
            link("/bindings", &[("vhost", vhost)], "all bindings")
        );
    }
    out.push_str(
        "<table id=\"bindings\"><tr><th>Exchange</th><th>Destination</th><th>Routing key</th>\
         <th>Arguments</th></tr>",
    );
    let mut bs: Vec<&pb::BindingInfo> = bs
        .iter()
        .filter(|b| exchange.is_none_or(|x| b.exchange == x))
        .collect();
    bs.sort_by(|a, b| (&a.exchange, &a.destination).cmp(&(&b.exchange, &b.destination)));
    for b in bs {
        // A queue links to its page; an exchange (an exchange-to-exchange binding) to the
        // bindings it routes on by.
        let destination = if b.destination_kind == "exchange" {
            let shown = format!("exchange {}", b.destination);
            link(
                "/bindings",
                &[("vhost", vhost), ("exchange", &b.destination)],
                &shown,
            )
        } else {
            link("/queue", &[("vhost", vhost), ("name", &b.queue)], &b.queue)
        };
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&b.exchange),
            destination,
            esc(&b.routing_key),
            esc(&pb_table(&b.arguments))
        );
    }
    out.push_str("</table>");
    out
}

/// A table of policies with HTML id `id`.
pub fn policies(id: &str, ps: &[pb::Policy]) -> String {
    let mut out = format!(
        "<table id=\"{}\"><tr><th>Name</th><th>Pattern</th><th>Apply to</th>\
         <th>Priority</th><th>Definition</th></tr>",
        esc(id)
    );
    let mut ps: Vec<&pb::Policy> = ps.iter().collect();
    ps.sort_by(|a, b| a.name.cmp(&b.name));
    for p in ps {
        let _ = write!(
            out,
            "<tr data-policy=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
            esc(&p.name),
            esc(&p.name),
            esc(&p.pattern),
            esc(&p.apply_to),
            p.priority,
            esc(&pb_table(&p.definition))
        );
    }
    out.push_str("</table>");
    out
}

/// A link to one queue, for the dead-letter target.
pub fn queue_link(vhost: &str, name: &str) -> String {
    format!(
        "<a href=\"{}\">{}</a>",
        esc(&href("/queue", &[("vhost", vhost), ("name", name)])),
        esc(name)
    )
}

#[cfg(test)]
mod tests;
