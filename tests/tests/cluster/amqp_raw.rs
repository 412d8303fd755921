//! A client that writes AMQP 0-9-1 frames by hand, for what lapin will not send or does not
//! show: arguments lapin refuses, and exactly which frames arrive in which order.

use anyhow::{Context, bail, ensure};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::amqp::WAIT;

/// The arguments of basic.qos.
pub fn qos(prefetch_size: u32, prefetch_count: u16) -> Vec<u8> {
    let mut a = prefetch_size.to_be_bytes().to_vec();
    a.extend_from_slice(&prefetch_count.to_be_bytes());
    a.push(0); // global: false
    a
}

pub fn shortstr(s: &str) -> Vec<u8> {
    let mut out = vec![s.len() as u8];
    out.extend_from_slice(s.as_bytes());
    out
}

pub fn longstr(b: &[u8]) -> Vec<u8> {
    let mut out = (b.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(b);
    out
}

/// basic.consume of `queue` with manual acks and a server-made tag.
pub fn consume_args(queue: &str) -> Vec<u8> {
    let mut a = 0u16.to_be_bytes().to_vec();
    a.extend_from_slice(&shortstr(queue));
    a.extend_from_slice(&shortstr(""));
    a.push(0); // no-local, no-ack, exclusive, no-wait: all false
    a.extend_from_slice(&0u32.to_be_bytes()); // arguments: an empty table
    a
}

/// channel.close from the client: 200, no text, no failing method.
pub fn close_args() -> Vec<u8> {
    let mut a = 200u16.to_be_bytes().to_vec();
    a.extend_from_slice(&shortstr(""));
    a.extend_from_slice(&[0, 0, 0, 0]);
    a
}

/// A client that writes frames by hand: for what lapin will not send.
pub struct Raw {
    io: TcpStream,
}

impl Raw {
    /// Connected, protocol header sent, connection.start read.
    pub async fn connect(address: &str) -> anyhow::Result<Raw> {
        let mut raw = Raw {
            io: TcpStream::connect(address).await?,
        };
        raw.io.write_all(b"AMQP\x00\x00\x09\x01").await?;
        raw.expect_method(0, (10, 10), "connection.start").await?;
        Ok(raw)
    }

    /// Logged in as guest, tuned with the server's limits and opened on vhost `/`.
    pub async fn open(address: &str) -> anyhow::Result<Raw> {
        let mut raw = Raw::connect(address).await?;
        raw.start_ok("PLAIN", b"\0guest\0guest").await?;
        let tune = raw.expect_method(0, (10, 30), "connection.tune").await?;
        // tune-ok: the server's channel_max and frame_max, no heartbeat.
        let mut tune_ok = tune.get(..6).context("short connection.tune")?.to_vec();
        tune_ok.extend_from_slice(&0u16.to_be_bytes());
        raw.send_method(0, 10, 31, &tune_ok, "connection.tune-ok")
            .await?;
        let mut open = shortstr("/");
        open.extend_from_slice(&shortstr(""));
        open.push(0);
        raw.send_method(0, 10, 40, &open, "connection.open").await?;
        raw.expect_method(0, (10, 41), "connection.open-ok").await?;
        Ok(raw)
    }

    /// connection.start-ok with `mechanism` and `response`, from a client with the
    /// `authentication_failure_close` capability.
    pub async fn start_ok(&mut self, mechanism: &str, response: &[u8]) -> anyhow::Result<()> {
        let mut caps = shortstr("authentication_failure_close");
        caps.extend_from_slice(&[b't', 1]);
        let mut props = shortstr("capabilities");
        props.push(b'F');
        props.extend_from_slice(&longstr(&caps));
        let mut args = longstr(&props);
        args.extend_from_slice(&shortstr(mechanism));
        args.extend_from_slice(&longstr(response));
        args.extend_from_slice(&shortstr("en_US"));
        self.send_method(0, 10, 11, &args, "connection.start-ok")
            .await
    }

    pub async fn send_method(
        &mut self,
        channel: u16,
        class: u16,
        method: u16,
        args: &[u8],
        what: &str,
    ) -> anyhow::Result<()> {
        let mut payload = class.to_be_bytes().to_vec();
        payload.extend_from_slice(&method.to_be_bytes());
        payload.extend_from_slice(args);
        let mut frame = vec![1];
        frame.extend_from_slice(&channel.to_be_bytes());
        frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        frame.extend_from_slice(&payload);
        frame.push(0xCE);
        self.io
            .write_all(&frame)
            .await
            .with_context(|| format!("sending {what}"))
    }

    /// The next frame (type, channel, payload); `None` when the socket closes first.
    pub async fn read_frame(&mut self) -> anyhow::Result<Option<(u8, u16, Vec<u8>)>> {
        let read = async {
            let mut header = [0u8; 7];
            match self.io.read_exact(&mut header).await {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(None),
                Err(e) => return Err(e.into()),
            }
            let size = u32::from_be_bytes([header[3], header[4], header[5], header[6]]) as usize;
            let mut payload = vec![0u8; size + 1];
            self.io.read_exact(&mut payload).await?;
            ensure!(payload.pop() == Some(0xCE), "no frame-end octet");
            let channel = u16::from_be_bytes([header[1], header[2]]);
            Ok(Some((header[0], channel, payload)))
        };
        tokio::time::timeout(WAIT, read)
            .await
            .context("no frame and no close within the wait")?
    }

    /// The next frame, which must be method `class_method` on `channel`: its arguments.
    pub async fn expect_method(
        &mut self,
        channel: u16,
        class_method: (u16, u16),
        what: &str,
    ) -> anyhow::Result<Vec<u8>> {
        let Some((kind, ch, payload)) = self.read_frame().await? else {
            bail!("the socket closed where {what} was expected");
        };
        ensure!(payload.len() >= 4, "{what}: short frame {payload:?}");
        let got = (
            u16::from_be_bytes([payload[0], payload[1]]),
            u16::from_be_bytes([payload[2], payload[3]]),
        );
        ensure!(
            kind == 1 && ch == channel && got == class_method,
            "expected {what} on channel {channel}, got frame type {kind} on channel {ch}: \
             method {got:?} {payload:?}"
        );
        Ok(payload[4..].to_vec())
    }

    /// Reads past every frame until method `class_method` on `channel` (deliveries that may
    /// come first, for one); the socket closing first is an error.
    pub async fn skip_to_method(
        &mut self,
        channel: u16,
        (class, method): (u16, u16),
        what: &str,
    ) -> anyhow::Result<()> {
        let mut id = class.to_be_bytes().to_vec();
        id.extend_from_slice(&method.to_be_bytes());
        loop {
            let (kind, ch, payload) = self
                .read_frame()
                .await?
                .with_context(|| format!("the socket closed before {what}"))?;
            if kind == 1 && ch == channel && payload.get(..4) == Some(id.as_slice()) {
                return Ok(());
            }
        }
    }
}
