//! `browse`: the ready messages of a queue, in queue order, without taking them; each with
//! its `x-death` summary (a dead-letter queue's reason for being there).

use clap::Args;
use qq_client::{Client, death_summary, display_table};

// The `Args` struct carries no doc comment: clap would take it for the verb's help text.

#[derive(Debug, Args)]
pub struct BrowseArgs {
    queue: String,
    /// Position of the first message to show (0: the head of the queue).
    #[arg(long, default_value_t = 0)]
    offset: u64,
    /// How many messages to show (at most 1000).
    #[arg(long, default_value_t = 20)]
    limit: u32,
}

pub async fn browse(client: &Client, a: BrowseArgs) -> anyhow::Result<()> {
    let r = client.browse(&a.queue, a.offset, a.limit).await?;
    for m in &r.messages {
        let (headers, body) = match &m.message {
            Some(msg) => (
                msg.properties
                    .as_ref()
                    .map(|p| p.headers.clone())
                    .unwrap_or_default(),
                String::from_utf8_lossy(&msg.body).into_owned(),
            ),
            None => (Default::default(), String::new()),
        };
        let exchange = if m.exchange.is_empty() {
            "(default)"
        } else {
            &m.exchange
        };
        println!(
            "#{} redelivered={} delivery-count={} exchange={exchange} routing-key={} headers={}",
            m.position,
            m.redelivered,
            m.delivery_count,
            m.routing_key,
            display_table(&headers)
        );
        for d in death_summary(&headers) {
            let detail = d
                .reason_detail
                .map(|t| format!(" reason-detail={t:?}"))
                .unwrap_or_default();
            println!(
                "  died: reason={} queue={} count={}{detail}",
                d.reason, d.queue, d.count
            );
        }
        println!("  body: {body}");
    }
    println!(
        "{} shown from position {}; {} ready in {}",
        r.messages.len(),
        a.offset,
        r.message_count,
        a.queue
    );
    Ok(())
}
