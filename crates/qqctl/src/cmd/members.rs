//! Membership verbs, in rabbitmq-queues' words where they fit: `add-member`, `delete-member`,
//! `grow`, `shrink`, `rebalance`, `check-quorum-critical` (exits non-zero when stopping the
//! node would break a queue's or the metadata's majority); and of the cluster itself,
//! `join-node` and `forget-node` (rabbitmqctl's `forget_cluster_node`).

use clap::Args;
use qq_client::Client;
use qq_proto::v1::MemberChange;

// No doc comment on the `Args` structs: clap would take it for the verb's help text.

#[derive(Debug, Args)]
pub struct MemberArgs {
    /// The queue (in the vhost given with --vhost).
    queue: String,
    /// The node id.
    #[arg(value_name = "NODE")]
    node_id: u64,
}

#[derive(Debug, Args)]
pub struct GrowArgs {
    /// The node id to add.
    #[arg(value_name = "NODE")]
    node_id: u64,
    /// A regex matched against queue names (unanchored); default: every queue.
    #[arg(default_value = "")]
    pattern: String,
    /// Only queues of this vhost (default: every vhost).
    #[arg(long = "in-vhost", default_value = "")]
    in_vhost: String,
}

#[derive(Debug, Args)]
pub struct JoinArgs {
    /// The new node's id (never used in this cluster before).
    #[arg(value_name = "NODE")]
    node_id: u64,
    /// Its client address, host:port.
    address: String,
    /// Its node-to-node (cluster) address, host:port.
    cluster_address: String,
}

#[derive(Debug, Args)]
pub struct NodeArgs {
    /// The node id.
    #[arg(value_name = "NODE")]
    node_id: u64,
}

fn line(c: &MemberChange) -> String {
    let mut s = format!(
        "{}\t{}\t{}\tmembers {:?}",
        c.vhost, c.queue, c.outcome, c.members
    );
    if !c.detail.is_empty() {
        s.push('\t');
        s.push_str(&c.detail);
    }
    s
}

fn print_changes(changes: &[MemberChange]) -> anyhow::Result<()> {
    for c in changes {
        println!("{}", line(c));
    }
    let errors = changes.iter().filter(|c| c.outcome == "error").count();
    if errors > 0 {
        anyhow::bail!("{errors} of {} queues not changed", changes.len());
    }
    Ok(())
}

pub async fn add_member(c: &Client, a: MemberArgs) -> anyhow::Result<()> {
    println!("{}", line(&c.add_member(&a.queue, a.node_id).await?));
    Ok(())
}

pub async fn delete_member(c: &Client, a: MemberArgs) -> anyhow::Result<()> {
    println!("{}", line(&c.delete_member(&a.queue, a.node_id).await?));
    Ok(())
}

pub async fn grow(c: &Client, a: GrowArgs) -> anyhow::Result<()> {
    print_changes(&c.grow_queues(a.node_id, &a.pattern, &a.in_vhost).await?)
}

pub async fn shrink(c: &Client, a: NodeArgs) -> anyhow::Result<()> {
    print_changes(&c.shrink_queues(a.node_id).await?)
}

pub async fn rebalance(c: &Client) -> anyhow::Result<()> {
    let r = c.rebalance_leaders().await?;
    for m in &r.moves {
        let what = if m.detail.is_empty() {
            "moved".to_string()
        } else {
            m.detail.clone()
        };
        println!(
            "{}\t{}\tleader {} -> {}\t{what}",
            m.vhost, m.queue, m.from, m.to
        );
    }
    let mut per_node: Vec<_> = r.leaders_per_node.iter().collect();
    per_node.sort();
    for (node, n) in per_node {
        println!("node {node} leads {n} queues");
    }
    Ok(())
}

pub async fn check_quorum_critical(c: &Client, a: NodeArgs) -> anyhow::Result<()> {
    let r = c.quorum_critical(a.node_id).await?;
    for q in &r.queues {
        println!(
            "{}\t{}\tmembers {:?}\tonline {:?}",
            q.vhost, q.queue, q.members, q.online
        );
    }
    if r.metadata {
        println!("the metadata group would lose its majority");
    }
    if r.queues.is_empty() && !r.metadata {
        println!(
            "node {} is not quorum critical: it can be stopped",
            a.node_id
        );
        return Ok(());
    }
    anyhow::bail!(
        "node {} is quorum critical: stopping it would break {} queue(s){}",
        a.node_id,
        r.queues.len(),
        if r.metadata { " and the metadata" } else { "" }
    )
}

pub async fn join_node(c: &Client, a: JoinArgs) -> anyhow::Result<()> {
    let detail = c
        .join_node(a.node_id, &a.address, &a.cluster_address)
        .await?;
    if detail.is_empty() {
        println!(
            "node {} joined the cluster (add replicas with: grow {} PATTERN)",
            a.node_id, a.node_id
        );
    } else {
        println!("{detail}");
    }
    Ok(())
}

pub async fn forget_node(c: &Client, a: NodeArgs) -> anyhow::Result<()> {
    let changes = c.forget_node(a.node_id).await?;
    print_changes(&changes)?;
    println!("node {} forgotten", a.node_id);
    Ok(())
}
