//! Read-only verbs: the list tables (queues, exchanges, bindings, policies), one queue as JSON,
//! cluster status and the overview counters.

use qq_client::{Client, display_table, v1};

use super::NameArgs;
use crate::output::{join_ids, print_table, queue_json, row};

pub async fn list_queues(client: &Client) -> anyhow::Result<()> {
    let queues = client.list_queues().await?;
    let mut rows = vec![row([
        "name",
        "messages",
        "ready",
        "unacked",
        "dl-held",
        "consumers",
        "leader",
        "members",
    ])];
    for q in &queues {
        rows.push(vec![
            q.name.clone(),
            q.messages.to_string(),
            q.messages_ready.to_string(),
            q.messages_unacked.to_string(),
            q.messages_dead_letter_held.to_string(),
            q.consumers.to_string(),
            q.leader.to_string(),
            join_ids(&q.members),
        ]);
    }
    print_table(&rows);
    Ok(())
}

pub async fn queue(client: &Client, a: NameArgs) -> anyhow::Result<()> {
    let q = client.get_queue(&a.name).await?;
    println!("{}", serde_json::to_string_pretty(&queue_json(&q))?);
    Ok(())
}

/// The default exchange's empty name, as tables show it.
fn or_default(name: String) -> String {
    if name.is_empty() {
        "(default)".to_string()
    } else {
        name
    }
}

pub async fn list_exchanges(client: &Client) -> anyhow::Result<()> {
    let mut rows = vec![row([
        "name",
        "type",
        "durable",
        "auto-delete",
        "internal",
        "arguments",
    ])];
    for e in client.list_exchanges().await? {
        rows.push(vec![
            or_default(e.name),
            e.r#type,
            e.durable.to_string(),
            e.auto_delete.to_string(),
            e.internal.to_string(),
            display_table(&e.arguments),
        ]);
    }
    print_table(&rows);
    Ok(())
}

pub async fn list_bindings(client: &Client) -> anyhow::Result<()> {
    let mut rows = vec![row([
        "source",
        "destination",
        "kind",
        "routing-key",
        "arguments",
    ])];
    for b in client.list_bindings().await? {
        rows.push(vec![
            or_default(b.exchange),
            b.destination,
            b.destination_kind,
            b.routing_key,
            display_table(&b.arguments),
        ]);
    }
    print_table(&rows);
    Ok(())
}

pub async fn list_policies(client: &Client) -> anyhow::Result<()> {
    print_policies(client.list_policies().await?);
    Ok(())
}

pub async fn list_operator_policies(client: &Client) -> anyhow::Result<()> {
    print_policies(client.list_operator_policies().await?);
    Ok(())
}

fn print_policies(policies: Vec<v1::Policy>) {
    let mut rows = vec![row([
        "name",
        "pattern",
        "apply-to",
        "priority",
        "definition",
    ])];
    for p in policies {
        rows.push(vec![
            p.name,
            p.pattern,
            p.apply_to,
            p.priority.to_string(),
            display_table(&p.definition),
        ]);
    }
    print_table(&rows);
}

pub async fn status(client: &Client) -> anyhow::Result<()> {
    let s = client.cluster_status().await?;
    println!("answered by node {}", s.node_id);
    if s.metadata_leader == 0 {
        println!("metadata leader: none");
    } else {
        println!("metadata leader: {}", s.metadata_leader);
    }
    let mut rows = vec![row(["node", "address", "reachable", "version"])];
    for n in &s.nodes {
        rows.push(vec![
            n.id.to_string(),
            n.address.clone(),
            n.reachable.to_string(),
            n.version.clone(),
        ]);
    }
    print_table(&rows);
    if !s.queues.is_empty() {
        println!();
        print_queue_leaders(&s.queues);
    }
    Ok(())
}

/// The queue part of `status`; the last two columns only for queues with a replica on the node
/// that answered.
fn print_queue_leaders(queues: &[v1::QueueLeader]) {
    let mut rows = vec![row([
        "vhost",
        "queue",
        "leader",
        "members",
        "applied here",
        "digest here",
    ])];
    for q in queues {
        let vhost = if q.vhost.is_empty() {
            "/".to_string()
        } else {
            q.vhost.clone()
        };
        rows.push(vec![
            vhost,
            q.name.clone(),
            q.leader.to_string(),
            join_ids(&q.members),
            if q.local_member {
                q.local_last_applied.to_string()
            } else {
                "-".into()
            },
            if q.local_member {
                format!("{:016x}", q.local_state_digest)
            } else {
                "-".into()
            },
        ]);
    }
    print_table(&rows);
}

pub async fn overview(client: &Client) -> anyhow::Result<()> {
    let o = client.overview().await?;
    println!("answered by node {}", o.node_id);
    println!("queues:           {}", o.queues);
    println!("messages:         {}", o.messages);
    println!("messages ready:   {}", o.messages_ready);
    println!("messages unacked: {}", o.messages_unacked);
    println!("consumers:        {}", o.consumers);
    println!(
        "dead-lettered (confirmed at-least-once): {}",
        o.messages_dead_lettered_confirmed_total
    );
    if !o.messages_dead_lettered_total.is_empty() {
        let mut rows = vec![row(["reason", "strategy", "dead-lettered"])];
        for c in &o.messages_dead_lettered_total {
            rows.push(vec![
                c.reason.clone(),
                c.strategy.clone(),
                c.count.to_string(),
            ]);
        }
        print_table(&rows);
    }
    Ok(())
}

pub async fn list_limits(client: &Client) -> anyhow::Result<()> {
    fn show(n: Option<u64>) -> String {
        n.map_or_else(|| "-".to_string(), |n| n.to_string())
    }
    let mut rows = vec![row([
        "scope",
        "name",
        "max-queues",
        "max-exchanges",
        "max-connections",
        "max-consumers",
    ])];
    let all = client.list_limits().await?;
    let scoped = all
        .vhosts
        .into_iter()
        .map(|v| ("vhost", v.vhost, v.limits))
        .chain(all.users.into_iter().map(|u| ("user", u.user, u.limits)));
    for (scope, name, limits) in scoped {
        let l = limits.unwrap_or_default();
        rows.push(vec![
            scope.to_string(),
            name,
            show(l.max_queues),
            show(l.max_exchanges),
            show(l.max_connections),
            show(l.max_consumers),
        ]);
    }
    print_table(&rows);
    Ok(())
}
