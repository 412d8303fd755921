//! A small W3C WebDriver client for the management page's browser test: chromedriver on a free
//! loopback port, driving Debian's headless Chromium with a fresh profile.
//!
//! Why not the fantoccini crate: it pulls `webdriver` → `icu_segmenter`, whose derive macros
//! change the features of the host `syn`, which rebuilds bindgen and with it RocksDB's C++ in
//! every target directory (about an hour on the 2-core machines). The handful of commands the
//! test needs are a few JSON requests over HTTP/1.1 on loopback.
//!
//! Bounded: every command has [`COMMAND_TIMEOUT`]; an answer is read to its Content-Length
//! (or last chunk), up to [`MAX_ANSWER_BYTES`].

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Debian's chromium and its driver (`make deps` installs both).
pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// One WebDriver command, at most (a navigation waits for the page to load).
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest answer read (a page source, a screenshot).
pub const MAX_ANSWER_BYTES: u64 = 32 * 1024 * 1024;
/// The W3C key of an element reference.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// chromedriver and one Chromium session; both end on drop.
pub struct Browser {
    driver: Child,
    address: String,
    session: String,
}

fn required(path: &str, package: &str) -> anyhow::Result<PathBuf> {
    let p = Path::new(path);
    if !p.exists() {
        bail!(
            "{path} not found: the management page's browser test needs Debian's {package}; \
             `make deps` installs it (apt-get install chromium chromium-driver)"
        );
    }
    Ok(p.to_path_buf())
}

/// Splits a raw HTTP answer into (status, body), de-chunking if needed.
fn parse_answer(raw: &[u8]) -> anyhow::Result<(u16, Vec<u8>)> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("WebDriver answer without a header end")?;
    let head = std::str::from_utf8(&raw[..end])?;
    let mut body = raw[end + 4..].to_vec();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("bad status line in {head:?}"))?;
    let chunked = head
        .lines()
        .any(|l| l.to_ascii_lowercase().starts_with("transfer-encoding:") && l.contains("chunked"));
    if chunked {
        let mut out = Vec::new();
        let mut rest = &body[..];
        loop {
            let line_end = rest
                .windows(2)
                .position(|w| w == b"\r\n")
                .context("bad chunk")?;
            let size = usize::from_str_radix(std::str::from_utf8(&rest[..line_end])?.trim(), 16)?;
            rest = &rest[line_end + 2..];
            if size == 0 {
                break;
            }
            out.extend_from_slice(rest.get(..size).context("short chunk")?);
            rest = rest.get(size + 2..).unwrap_or_default();
        }
        body = out;
    }
    Ok((status, body))
}

/// Reads one HTTP answer: to its Content-Length, its last chunk, or the end of the stream
/// (chromedriver may keep the connection open despite `Connection: close`).
async fn read_answer(stream: &mut tokio::net::TcpStream) -> anyhow::Result<Vec<u8>> {
    let mut raw = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
            let body = raw.len() - (end + 4);
            let length = head.lines().find_map(|l| {
                l.strip_prefix("content-length:")
                    .and_then(|v| v.trim().parse::<usize>().ok())
            });
            if length.is_some_and(|n| body >= n) {
                return Ok(raw);
            }
            if head.contains("transfer-encoding: chunked") && raw.ends_with(b"\r\n0\r\n\r\n") {
                return Ok(raw);
            }
        }
        if raw.len() as u64 > MAX_ANSWER_BYTES {
            bail!("WebDriver answer larger than {MAX_ANSWER_BYTES} bytes");
        }
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(raw);
        }
        raw.extend_from_slice(&buf[..n]);
    }
}

/// One HTTP/1.1 request to `address`; the JSON answer.
async fn request(
    address: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> anyhow::Result<(u16, Value)> {
    let payload = body.map(|b| b.to_string()).unwrap_or_default();
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(address).await?;
        let mut text = format!(
            "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\
             Accept: application/json\r\n"
        );
        if body.is_some() {
            text.push_str(&format!(
                "Content-Type: application/json; charset=utf-8\r\nContent-Length: {}\r\n",
                payload.len()
            ));
        }
        text.push_str("\r\n");
        text.push_str(&payload);
        stream.write_all(text.as_bytes()).await?;
        read_answer(&mut stream).await
    };
    let raw = tokio::time::timeout(COMMAND_TIMEOUT, exchange)
        .await
        .with_context(|| {
            format!("WebDriver {method} {path}: no answer in {COMMAND_TIMEOUT:?}")
        })??;
    let (status, body) = parse_answer(&raw)?;
    let value: Value = serde_json::from_slice(&body)
        .with_context(|| format!("WebDriver {method} {path}: answer is not JSON"))?;
    Ok((status, value))
}

/// Fails, naming `make deps`, unless Debian's chromium and chromium-driver are installed.
pub fn check_installed() -> anyhow::Result<()> {
    required(CHROMIUM, "chromium")?;
    required(CHROMEDRIVER, "chromium-driver")?;
    Ok(())
}

impl Browser {
    /// Starts chromedriver on a free port and a headless Chromium session with its profile in
    /// `dir` (the driver's log too). Fails, naming `make deps`, when either is missing.
    pub async fn start(dir: &Path) -> anyhow::Result<Browser> {
        let chromium = required(CHROMIUM, "chromium")?;
        let chromedriver = required(CHROMEDRIVER, "chromium-driver")?;
        let port = crate::free_ports(1)?[0];
        let log_path = dir.join("chromedriver.log");
        let log = std::fs::File::create(&log_path)?;
        // Its own process group, so the drop can end Chromium with it even when no session
        // was established (a Chromium whose session request timed out).
        let driver = Command::new(&chromedriver)
            .process_group(0)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("start {}", chromedriver.display()))?;
        let mut browser = Browser {
            driver,
            address: format!("127.0.0.1:{port}"),
            session: String::new(),
        };
        let capabilities = json!({
            "capabilities": { "alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": chromium,
                    "args": [
                        "--headless",
                        "--no-sandbox",
                        "--disable-gpu",
                        "--disable-quic",
                        "--no-first-run",
                        "--disable-background-networking",
                        "--disable-component-update",
                        "--disable-sync",
                        "--disable-dev-shm-usage",
                        "--window-size=1400,1000",
                        format!("--user-data-dir={}", dir.join("profile").display()),
                    ]
                }
            }}
        });
        let address = browser.address.clone();
        let value = crate::eventually(
            "chromedriver to start a Chromium session",
            COMMAND_TIMEOUT,
            || {
                let (address, capabilities, log_path) = (&address, &capabilities, &log_path);
                async move {
                    let (status, v) = request(address, "POST", "/session", Some(capabilities))
                        .await
                        .with_context(|| {
                            format!("chromedriver log: {}", crate::tail(log_path, 20))
                        })?;
                    if status != 200 {
                        bail!(
                            "new session: {status} {v}; chromedriver log: {}",
                            crate::tail(log_path, 20)
                        );
                    }
                    Ok(Some(v))
                }
            },
        )
        .await?;
        browser.session = value["value"]["sessionId"]
            .as_str()
            .context("new session: no sessionId")?
            .to_string();
        Ok(browser)
    }

    /// A command of the session: its `value`, or the WebDriver error.
    async fn command(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let full = format!("/session/{}{path}", self.session);
        let (status, v) = request(&self.address, method, &full, body.as_ref()).await?;
        if status != 200 {
            bail!(
                "WebDriver {method} {path}: {status} {}: {}",
                v["value"]["error"].as_str().unwrap_or("?"),
                v["value"]["message"]
                    .as_str()
                    .unwrap_or("")
                    .lines()
                    .next()
                    .unwrap_or("")
            );
        }
        Ok(v["value"].clone())
    }

    /// Navigates to `url` and waits for the page to load.
    pub async fn goto(&self, url: &str) -> anyhow::Result<()> {
        self.command("POST", "/url", Some(json!({ "url": url })))
            .await
            .map(drop)
    }

    /// The URL of the current page.
    pub async fn url(&self) -> anyhow::Result<String> {
        Ok(self
            .command("GET", "/url", None)
            .await?
            .as_str()
            .context("url: not a string")?
            .to_string())
    }

    /// The path of the current page's URL (without the query).
    pub async fn path(&self) -> anyhow::Result<String> {
        let url = self.url().await?;
        let after_host = url
            .split_once("://")
            .and_then(|(_, rest)| rest.find('/').map(|i| rest[i..].to_string()))
            .unwrap_or_else(|| "/".to_string());
        Ok(after_host
            .split(['?', '#'])
            .next()
            .unwrap_or("/")
            .to_string())
    }

    /// The HTML of the current page, as the browser holds it.
    pub async fn source(&self) -> anyhow::Result<String> {
        Ok(self
            .command("GET", "/source", None)
            .await?
            .as_str()
            .unwrap_or_default()
            .to_string())
    }

    /// The first element matching the CSS `selector`.
    pub async fn find(&self, selector: &str) -> anyhow::Result<Element<'_>> {
        let v = self
            .command(
                "POST",
                "/element",
                Some(json!({ "using": "css selector", "value": selector })),
            )
            .await
            .with_context(|| format!("find {selector}"))?;
        let id = v[ELEMENT_KEY]
            .as_str()
            .with_context(|| format!("find {selector}: no element reference in {v}"))?;
        Ok(Element {
            browser: self,
            id: id.to_string(),
        })
    }

    /// The rendered text of the first element matching `selector`.
    pub async fn text(&self, selector: &str) -> anyhow::Result<String> {
        self.find(selector).await?.text().await
    }

    /// A PNG of the viewport.
    pub async fn screenshot(&self) -> anyhow::Result<Vec<u8>> {
        use base64::Engine;
        let v = self.command("GET", "/screenshot", None).await?;
        Ok(base64::engine::general_purpose::STANDARD
            .decode(v.as_str().context("screenshot: not a string")?)?)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Ending the session quits Chromium (a killed chromedriver could leave it running);
        // a blocking request with a short timeout, since drop cannot wait on the runtime.
        if !self.session.is_empty()
            && let Ok(addr) = self.address.parse()
            && let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        {
            use std::io::{Read, Write};
            let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
            let _ = write!(
                s,
                "DELETE /session/{} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
                self.session, self.address
            );
            // One read: the answer (chromedriver may keep the connection open).
            let _ = s.read(&mut [0u8; 4096]);
        }
        // The whole group: chromedriver and any Chromium it started.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.driver.id())])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// An element of the current page.
pub struct Element<'a> {
    browser: &'a Browser,
    id: String,
}

impl Element<'_> {
    pub async fn text(&self) -> anyhow::Result<String> {
        Ok(self
            .browser
            .command("GET", &format!("/element/{}/text", self.id), None)
            .await?
            .as_str()
            .unwrap_or_default()
            .to_string())
    }

    /// Types `text` into it.
    pub async fn send_keys(&self, text: &str) -> anyhow::Result<()> {
        self.browser
            .command(
                "POST",
                &format!("/element/{}/value", self.id),
                Some(json!({ "text": text })),
            )
            .await
            .map(drop)
    }

    pub async fn click(&self) -> anyhow::Result<()> {
        self.browser
            .command(
                "POST",
                &format!("/element/{}/click", self.id),
                Some(json!({})),
            )
            .await
            .map(drop)
    }
}
