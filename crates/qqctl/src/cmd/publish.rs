//! `publish`: one message, or `--count` generated ones with a confirmed-rate summary, over
//! unary publishes or the pipelined PublishStream (`--stream`).
//!
//! Every message carries a publisher id (`--publisher-id`, random by default) and its number
//! as `publisher_seq`, so a retry never stores a message twice: unary publishes that fail
//! with UNAVAILABLE (a leader change) are retried with the same id and seq, and running the
//! same command again with the same `--publisher-id` stores nothing new within the queues'
//! dedup window (the confirms say `duplicate`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use qq_client::{Client, Confirm, MessageBuilder, PublishOutcome, Value, v1};

use crate::typed::parse_pairs;

// No doc comment here: clap would take it for the verb's help text.
#[derive(Debug, Args)]
pub struct PublishArgs {
    /// Exchange (default: the nameless default exchange, routing to the queue named by --key).
    #[arg(long, default_value = "")]
    exchange: String,
    #[arg(long)]
    key: String,
    /// Message body as text.
    #[arg(long, conflicts_with_all = ["count", "size"])]
    body: Option<String>,
    /// Publish this many generated messages and print the confirmed rate.
    #[arg(long)]
    count: Option<u64>,
    /// Body size in bytes of generated messages.
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Header key=value (typed like --arg).
    #[arg(long = "header", value_name = "KEY=VALUE")]
    headers: Vec<String>,
    /// Per-message TTL in ms (sent as given: the server validates it).
    #[arg(long)]
    expiration: Option<String>,
    /// Return UNROUTABLE when no queue matches.
    #[arg(long)]
    mandatory: bool,
    /// Use the pipelined PublishStream instead of unary publishes.
    #[arg(long)]
    stream: bool,
    /// Unconfirmed messages in flight with --stream.
    #[arg(long, default_value_t = 256)]
    window: usize,
    /// Publisher id for deduplication (message i gets publisher_seq i+1). Default: random.
    #[arg(long)]
    publisher_id: Option<String>,
}

/// Attempts of one unary publish that fails with UNAVAILABLE, and the pause between them.
const ATTEMPTS: u32 = 20;
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// Count of confirms per outcome name.
type Tally = HashMap<String, u64>;

pub async fn publish(client: &Client, mut p: PublishArgs) -> anyhow::Result<()> {
    let headers = parse_pairs(&p.headers)?;
    if p.publisher_id.is_none() {
        p.publisher_id = Some(format!("qqctl-{:016x}", rand::random::<u64>()));
    }
    match p.count {
        None => publish_one(client, &p, &headers).await,
        Some(count) => publish_many(client, &p, &headers, count).await,
    }
}

/// The request for message `i` with the given body; everything else comes from the flags.
fn request(
    p: &PublishArgs,
    headers: &HashMap<String, Value>,
    i: u64,
    body: Vec<u8>,
) -> v1::PublishRequest {
    let mut b = MessageBuilder::new(body).headers(headers.clone());
    if let Some(e) = &p.expiration {
        b = b.expiration(e.clone());
    }
    v1::PublishRequest {
        exchange: p.exchange.clone(),
        routing_key: p.key.clone(),
        mandatory: p.mandatory,
        message: Some(b.build()),
        publisher_id: p.publisher_id.clone().unwrap_or_default(),
        publisher_seq: i + 1,
        ..Default::default()
    }
}

/// A unary publish, retried with the same publisher id and seq while the cluster answers
/// UNAVAILABLE (a leader change): the queue stores it once however often it is sent.
async fn publish_retrying(client: &Client, req: v1::PublishRequest) -> anyhow::Result<Confirm> {
    let mut attempt = 1;
    loop {
        match client.publish_with(req.clone()).await {
            Err(e) if attempt < ATTEMPTS && e.code() == tonic::Code::Unavailable => {
                attempt += 1;
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            other => return Ok(other?),
        }
    }
}

async fn publish_one(
    client: &Client,
    p: &PublishArgs,
    headers: &HashMap<String, Value>,
) -> anyhow::Result<()> {
    let req = request(
        p,
        headers,
        0,
        p.body.clone().unwrap_or_default().into_bytes(),
    );
    let confirm = if p.stream {
        let mut publisher = client.publisher(1).await?;
        publisher.send_request(req).await?;
        let confirms = publisher.close().await?;
        confirms.into_iter().next().context("no confirm received")?
    } else {
        publish_retrying(client, req).await?
    };
    print_outcome(confirm.outcome, &confirm.detail);
    Ok(())
}

fn print_outcome(outcome: PublishOutcome, detail: &str) {
    if detail.is_empty() {
        println!("{}", outcome.as_str_name());
    } else {
        println!("{}: {detail}", outcome.as_str_name());
    }
}

async fn publish_many(
    client: &Client,
    p: &PublishArgs,
    headers: &HashMap<String, Value>,
    count: u64,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let requests = (0..count).map(|i| request(p, headers, i, generated_body(i, p.size)));
    let tally = if p.stream {
        publish_streamed(client, p.window, requests).await?
    } else {
        publish_unary(client, requests).await?
    };
    print_rate(count, started.elapsed(), &tally);
    Ok(())
}

/// `msg-<i> ` padded with dots to `size` bytes (never truncated).
fn generated_body(i: u64, size: usize) -> Vec<u8> {
    let mut b = format!("msg-{i} ").into_bytes();
    b.resize(size.max(b.len()), b'.');
    b
}

async fn publish_streamed(
    client: &Client,
    window: usize,
    requests: impl Iterator<Item = v1::PublishRequest>,
) -> anyhow::Result<Tally> {
    let mut tally = Tally::new();
    let mut publisher = client.publisher(window).await?;
    for req in requests {
        publisher.send_request(req).await?;
        for c in publisher.take_confirms() {
            count(&mut tally, &c);
        }
    }
    for c in publisher.close().await? {
        count(&mut tally, &c);
    }
    Ok(tally)
}

async fn publish_unary(
    client: &Client,
    requests: impl Iterator<Item = v1::PublishRequest>,
) -> anyhow::Result<Tally> {
    let mut tally = Tally::new();
    for req in requests {
        let c = publish_retrying(client, req).await?;
        count(&mut tally, &c);
    }
    Ok(tally)
}

/// Count a confirm under its outcome, and confirmed duplicates also as DUPLICATE.
fn count(tally: &mut Tally, c: &Confirm) {
    *tally
        .entry(c.outcome.as_str_name().to_string())
        .or_default() += 1;
    if c.outcome == PublishOutcome::Confirmed && c.detail == "duplicate" {
        *tally.entry("DUPLICATE".to_string()).or_default() += 1;
    }
}

fn print_rate(count: u64, elapsed: Duration, tally: &Tally) {
    let secs = elapsed.as_secs_f64();
    let confirmed = tally
        .get(PublishOutcome::Confirmed.as_str_name())
        .copied()
        .unwrap_or(0);
    let mut outcomes: Vec<String> = tally.iter().map(|(o, n)| format!("{o}={n}")).collect();
    outcomes.sort();
    println!("{count} messages in {secs:.2} s: {}", outcomes.join(" "));
    println!("{:.0} confirmed msgs/s", confirmed as f64 / secs.max(1e-9));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_bodies_are_padded_not_truncated() {
        assert_eq!(generated_body(7, 10), b"msg-7 ....");
        assert_eq!(generated_body(12345, 3), b"msg-12345 ");
    }
}
