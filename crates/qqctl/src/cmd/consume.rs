//! Verbs that take messages out of a queue: `get` (one message, requeued unless `--ack`) and
//! `consume` (a subscription, settling every delivery), and how a delivery is printed.

use std::time::Duration;

use clap::Args;
use qq_client::{Client, Consumer, Delivery, SettleOutcome, display_table};

// The `Args` structs carry no doc comment: clap would take it for the verb's help text.

#[derive(Debug, Args)]
pub struct GetArgs {
    queue: String,
    /// Remove the message from the queue (auto-ack).
    #[arg(long, conflicts_with = "no_ack")]
    ack: bool,
    /// Leave the message in the queue (it is released back after printing: not a failed
    /// delivery, so x-delivery-count and the delivery limit do not move; x-acquired-count does).
    #[arg(long)]
    no_ack: bool,
}

pub async fn get(client: &Client, a: GetArgs) -> anyhow::Result<()> {
    // --no-ack is the default; the flag exists to say so explicitly.
    let GetArgs {
        queue,
        ack,
        no_ack: _,
    } = a;
    let r = client.get(&queue, ack, 0).await?;
    match r.delivery {
        None => println!("queue {queue} is empty"),
        Some(d) => {
            print_delivery(&d, Some(&d.receipt));
            if !ack {
                client
                    .settle(vec![d.receipt.clone()], SettleOutcome::Release)
                    .await?;
                println!("(released back to the queue; use --ack to remove it)");
            }
        }
    }
    println!("{} messages left", r.message_count);
    Ok(())
}

#[derive(Debug, Args)]
pub struct ConsumeArgs {
    queue: String,
    #[arg(long, default_value_t = 10)]
    prefetch: u32,
    /// Stop after this many deliveries (default: run until interrupted).
    #[arg(long)]
    count: Option<u64>,
    /// Reject every delivery (dead-letters with reason `rejected`).
    #[arg(long, conflicts_with_all = ["requeue", "release"])]
    reject: bool,
    /// Requeue every delivery (redelivered, x-delivery-count + 1).
    #[arg(long, conflicts_with = "release")]
    requeue: bool,
    /// Release every delivery back to the queue (redelivered; not a failed delivery:
    /// x-acquired-count + 1, x-delivery-count unchanged).
    #[arg(long)]
    release: bool,
    /// With --reject: the reason detail recorded in the dead letter's x-death entry
    /// (reason-detail) and x-last-death-detail header (at most 1024 bytes).
    #[arg(long, requires = "reject", conflicts_with = "requeue")]
    reason: Option<String>,
    /// With --requeue: not delivered again before this many ms (default: the queue's
    /// x-requeue-delays, else at once).
    #[arg(long, requires = "requeue", conflicts_with = "reject")]
    delay_ms: Option<u64>,
}

pub async fn consume(client: &Client, a: ConsumeArgs) -> anyhow::Result<()> {
    let mut consumer = client.consume(&a.queue, a.prefetch).await?;
    eprintln!(
        "consuming from {} as {} (ctrl-c to stop)",
        a.queue,
        consumer.consumer_tag()
    );
    let mut seen = 0u64;
    while a.count.is_none_or(|c| seen < c) {
        let d = tokio::select! {
            d = consumer.next() => d,
            _ = tokio::signal::ctrl_c() => break,
        };
        let Some(d) = d else {
            match consumer.cancel_reason() {
                Some(reason) => println!("cancelled by the server: {reason}"),
                None => println!("stream ended"),
            }
            break;
        };
        let d = d?;
        print_delivery(&d, None);
        settle(&consumer, &a, d.delivery_tag).await?;
        seen += 1;
    }
    consumer.cancel().await.ok();
    // Drain until the server confirms the cancel, so settles are not lost with the stream; a
    // settle the server refused (e.g. a --reason too long) ends the stream with its status.
    loop {
        match consumer.next_timeout(Duration::from_secs(2)).await {
            Ok(Some(_)) => continue,
            Ok(None) => break,
            Err(e) => return Err(e.into()),
        }
    }
    eprintln!("{seen} deliveries");
    Ok(())
}

/// Rejects, requeues, releases or (the default) acks one delivery, as the flags say.
async fn settle(consumer: &Consumer, a: &ConsumeArgs, tag: u64) -> anyhow::Result<()> {
    if a.reject {
        let detail = a.reason.clone();
        consumer
            .settle_with(vec![tag], false, SettleOutcome::Reject, detail, None)
            .await?;
    } else if a.requeue {
        consumer
            .settle_with(vec![tag], false, SettleOutcome::Requeue, None, a.delay_ms)
            .await?;
    } else if a.release {
        consumer
            .settle_with(vec![tag], false, SettleOutcome::Release, None, None)
            .await?;
    } else {
        consumer.ack(tag, false).await?;
    }
    Ok(())
}

/// One line of metadata (the receipt for `get`, the delivery tag for `consume`), then the body.
fn print_delivery(d: &Delivery, receipt: Option<&str>) {
    let (headers, body) = match &d.message {
        Some(m) => (
            m.properties
                .as_ref()
                .map(|p| display_table(&p.headers))
                .unwrap_or_else(|| "{}".into()),
            String::from_utf8_lossy(&m.body).into_owned(),
        ),
        None => ("{}".into(), String::new()),
    };
    let id = match receipt {
        Some(r) => format!("receipt={r}"),
        None => format!("tag={}", d.delivery_tag),
    };
    let exchange = if d.exchange.is_empty() {
        "(default)"
    } else {
        &d.exchange
    };
    println!(
        "{id} redelivered={} exchange={exchange} routing-key={} headers={headers}\n  body: {body}",
        d.redelivered, d.routing_key
    );
}
