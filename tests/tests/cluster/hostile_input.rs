//! Story: an unprivileged user attacks the client port with hostile input (issue 31), and
//! every answer is the precise status docs/api.md gives, short, and tells nothing of other
//! vhosts.
//!
//! 1. A name may hold quotes and backslashes, and `/metrics` escapes them in its labels; a new
//!    name with a control or bidi/format character is refused, naming the field.
//! 2. A 40 KiB name is refused as an argument (INVALID_ARGUMENT naming the field) before any
//!    lookup, in a short message, by every RPC that takes one; StartMoveTask with a 256-byte
//!    destination names `destination`.
//! 3. Bytes that do not decode as the RPC's message answer INVALID_ARGUMENT, not INTERNAL.
//! 4. ListMoveTasks, a receipt and a move task id of a queue in a vhost the user may not see
//!    answer exactly as for a vhost or queue that does not exist.
//!
//! The rows of docs/security.md name these tests.

use std::time::Duration;

use bytes::{Buf, BufMut};
use qq_client::{Error, SettleOutcome, message};
use qq_proto::v1 as pb;
use qq_tests::{TestCluster, eventually, info};
use tonic::Code;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

use super::assert_status;

/// A name far over the 255-byte bound.
fn huge() -> String {
    "n".repeat(40 * 1024)
}

/// `result` failed with INVALID_ARGUMENT naming `field`, in a message that does not echo the
/// huge input.
#[track_caller]
fn assert_refused_short<T: std::fmt::Debug>(result: Result<T, Error>, field: &str) {
    let message = match &result {
        Err(e) => e
            .status()
            .map(|s| s.message().to_string())
            .unwrap_or_default(),
        Ok(_) => String::new(),
    };
    assert!(message.len() < 300, "{} byte message", message.len());
    assert_status(result, Code::InvalidArgument, field);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metric_labels_are_escaped_and_new_names_refuse_control_characters() -> anyhow::Result<()> {
    let cluster = TestCluster::start(1).await?;
    let c = cluster.client(1).await?;

    info!("--- quotes, braces and backslashes are fine in a name, and escaped in /metrics");
    let quoted = r#"m"} 1 quorumq_injected{a="\"#;
    c.declare_queue(quoted, Default::default()).await?;
    let escaped = r#"queue="m\"} 1 quorumq_injected{a=\"\\""#;
    let text = eventually("the queue's series", Duration::from_secs(30), || async {
        let (status, body) = cluster.http_get(1, "/metrics").await?;
        anyhow::ensure!(status == 200, "GET /metrics: {status}");
        Ok(body.contains(escaped).then_some(body))
    })
    .await?;
    let injected: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("quorumq_injected") || l.contains(r#"queue="m"}"#))
        .collect();
    assert!(injected.is_empty(), "unescaped label values: {injected:?}");

    info!("--- a new name with a control or bidi/format character is refused, naming the field");
    for bad in [
        "a\nb",
        "a\0b",
        "a\u{7f}",
        "a\u{85}b",
        "evil\u{202E}gnp.exe",
        "\u{2066}x",
    ] {
        assert_status(
            c.declare_queue(bad, Default::default()).await,
            Code::InvalidArgument,
            "name: contains U+",
        );
        assert_status(
            c.declare_exchange(bad, "direct").await,
            Code::InvalidArgument,
            "name: contains U+",
        );
        assert_status(
            c.put_vhost(bad).await,
            Code::InvalidArgument,
            "name: contains U+",
        );
        assert_status(
            c.put_user(bad, "pw", vec![]).await,
            Code::InvalidArgument,
            "name: contains U+",
        );
    }
    let names: Vec<String> = c.list_queues().await?.into_iter().map(|q| q.name).collect();
    assert_eq!(names, vec![quoted.to_string()], "nothing else was created");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_long_names_are_refused_naming_the_field_without_echoing_them() -> anyhow::Result<()> {
    let cluster = TestCluster::start(1).await?;
    let c = cluster.client(1).await?;
    c.declare_queue("src.q", Default::default()).await?;
    let long = huge();

    info!("--- lookups by name: INVALID_ARGUMENT naming the field, in a short message");
    assert_refused_short(c.get_queue(&long).await, "name");
    assert_refused_short(c.delete_queue(&long, false, false).await, "name");
    assert_refused_short(c.purge_queue(&long).await, "name");
    assert_refused_short(c.get(&long, true, 0).await, "queue");
    assert_refused_short(c.browse(&long, 0, 10).await, "queue");
    assert_refused_short(c.declare_queue_passive(&long).await, "name");
    let passive = pb::DeclareExchangeRequest {
        name: long.clone(),
        r#type: "direct".into(),
        passive: true,
        ..Default::default()
    };
    assert_refused_short(c.declare_exchange_with(passive).await, "name");
    assert_refused_short(c.publish(&long, "k", message("x")).await, "exchange");
    assert_refused_short(c.start_move_task(&long, "", 0, 0).await, "source");
    assert_refused_short(c.start_move_task("src.q", &long, 0, 0).await, "destination");
    assert_refused_short(c.add_member(&long, 1).await, "queue");
    assert_refused_short(c.consume(&long, 1).await.map(|_| ()), "queue");
    let far = c.clone().with_vhost(&long);
    assert_refused_short(far.list_queues().await, "vhost");
    assert_refused_short(far.list_exchanges().await, "vhost");
    assert_refused_short(far.list_move_tasks().await, "vhost");
    assert_refused_short(c.get_move_task(&long).await, "task_id");
    assert_refused_short(c.cancel_move_task(&long).await, "task_id");
    assert_refused_short(
        c.settle(vec![long.clone()], SettleOutcome::Ack).await,
        "receipts",
    );

    info!("--- StartMoveTask with a 256-byte destination names destination");
    assert_status(
        c.start_move_task("src.q", &"d".repeat(256), 0, 0).await,
        Code::InvalidArgument,
        "destination: 256 bytes, more than 255",
    );
    Ok(())
}

/// Bytes in, bytes out: sends what the test wrote, whatever the RPC's message type.
#[derive(Default)]
struct RawCodec;

struct RawCoder;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCoder;
    type Decoder = RawCoder;
    fn encoder(&mut self) -> RawCoder {
        RawCoder
    }
    fn decoder(&mut self) -> RawCoder {
        RawCoder
    }
}

impl Encoder for RawCoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_requests_answer_invalid_argument() -> anyhow::Result<()> {
    let cluster = TestCluster::start(1).await?;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", cluster.address(1)))?
        .connect()
        .await?;
    let mut grpc = tonic::client::Grpc::new(channel);
    // GetQueueRequest: field 1 vhost, field 2 name (strings).
    let cases: [(&str, Vec<u8>); 3] = [
        ("invalid UTF-8 in a string", vec![0x12, 0x02, 0xff, 0xfe]),
        ("a bad varint", [vec![0x12], vec![0xff; 11]].concat()),
        ("a truncated field", vec![0x12, 0x05, b'a']),
    ];
    for (what, bytes) in cases {
        info!(what, "--- GetQueue with bytes that do not decode");
        grpc.ready().await?;
        let path = "/qq.v1.Broker/GetQueue".parse()?;
        let answer = grpc
            .unary(tonic::Request::new(bytes), path, RawCodec::default())
            .await;
        let status = answer.expect_err(what);
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        assert!(
            status.message().contains("does not decode"),
            "{what}: {status:?}"
        );
    }
    info!("--- the node still serves");
    cluster.client(1).await?.list_queues().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vhost_scoped_lookups_do_not_tell_which_vhosts_exist() -> anyhow::Result<()> {
    let cluster = TestCluster::start(1).await?;
    let admin = cluster.client(1).await?;
    admin.put_vhost("secret").await?;
    admin
        .set_permissions("guest", "secret", ".*", ".*", ".*")
        .await?;
    admin.put_user("mallory", "m-pw", vec![]).await?;
    admin
        .set_permissions("mallory", "/", ".*", ".*", ".*")
        .await?;
    let mallory = admin.clone().with_credentials("mallory", "m-pw")?;

    info!(
        "--- ListMoveTasks: the same PERMISSION_DENIED for a vhost that exists and one that does not"
    );
    let existing = mallory.clone().with_vhost("secret").list_move_tasks().await;
    let missing = mallory
        .clone()
        .with_vhost("nowhere")
        .list_move_tasks()
        .await;
    assert_status(
        existing,
        Code::PermissionDenied,
        "access to vhost 'secret' refused",
    );
    assert_status(
        missing,
        Code::PermissionDenied,
        "access to vhost 'nowhere' refused",
    );

    info!(
        "--- a receipt of a queue in another vhost answers as one of a queue that does not exist"
    );
    let secret = admin.clone().with_vhost("secret");
    secret.declare_queue("s.q", Default::default()).await?;
    secret.publish("", "s.q", message("x")).await?;
    let receipt = secret
        .get("s.q", false, 60_000)
        .await?
        .delivery
        .expect("a message")
        .receipt;
    let (id, rest) = receipt.split_once('.').expect("QUEUE.ID.TOKEN");
    let unknown = format!("9999.{rest}");
    let settle = |r: String| {
        let mallory = mallory.clone();
        async move { mallory.settle(vec![r], SettleOutcome::Ack).await }
    };
    let theirs = settle(receipt.clone()).await.expect_err("not mallory's");
    let nobodys = settle(unknown).await.expect_err("no such queue");
    let code_and_text = |e: &Error, id: &str| {
        let s = e.status().expect("a status");
        (s.code(), s.message().replace(id, "ID"))
    };
    assert_eq!(code_and_text(&theirs, id), code_and_text(&nobodys, "9999"));
    assert_eq!(theirs.code(), Code::NotFound, "{theirs}");

    info!("--- so does a move task id of a queue in another vhost");
    let theirs = mallory
        .get_move_task(&format!("{id}.7"))
        .await
        .expect_err("hidden");
    let nobodys = mallory.get_move_task("9999.7").await.expect_err("missing");
    assert_eq!(code_and_text(&theirs, id), code_and_text(&nobodys, "9999"));
    assert_eq!(theirs.code(), Code::NotFound, "{theirs}");
    let theirs = mallory
        .cancel_move_task(&format!("{id}.7"))
        .await
        .expect_err("hidden");
    assert_eq!(theirs.code(), Code::NotFound, "{theirs}");
    assert!(!theirs.to_string().contains("secret"), "{theirs}");

    info!("--- the owner settles its own receipt");
    secret.settle(vec![receipt], SettleOutcome::Ack).await?;
    Ok(())
}
