//! Story: an operator looks at the management page on `http_addr` in a real browser.
//!
//! 1. Without a session every view redirects to `/login` (plain HTTP, no browser); a wrong
//!    password is refused with 401.
//! 2. A dead-lettering topology declared through the gRPC API (a DLX, a work queue with
//!    x-dead-letter-exchange, x-dead-letter-routing-key, x-message-ttl, x-max-length and
//!    x-delivery-limit, its DLQ bound to the DLX, a policy on another queue) and a message
//!    rejected with a reason; then, in headless Chromium driven through chromedriver: the
//!    login page refuses a wrong password, an administrator logs in, sees the nodes, the
//!    queues with their feature tags (DLX, DLK, TTL, Lim, D-Lim, the policy's Lim), the
//!    settings with who set each, the DLQ with its x-death reason count, and the other vhost;
//!    a user with access to `/` only does not see the other vhost's queue.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`make deps` installs them): the test fails,
//! saying so, when they are missing. The browser is driven through chromedriver by
//! [`qq_tests::webdriver`].

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use qq_client::{Client, Value, ValueExt, message, table};
use qq_tests::webdriver::Browser;
use qq_tests::{TestCluster, eventually, info};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(60);

/// A raw HTTP/1.0 exchange: (status, head, body).
async fn http(address: &str, request: String) -> anyhow::Result<(u16, String, String)> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(address).await?;
        stream.write_all(request.as_bytes()).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        anyhow::Ok(raw)
    };
    let raw = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .context("no HTTP answer in 10 s")??;
    let text = String::from_utf8(raw)?;
    let (head, body) = text.split_once("\r\n\r\n").context("no header end")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("bad status line")?;
    Ok((status, head.to_string(), body.to_string()))
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_without_a_session_redirects_to_login() -> anyhow::Result<()> {
    let cluster = TestCluster::start(1).await?;
    let address = cluster.http_address(1).to_string();
    for path in [
        "/",
        "/queues",
        "/queue?name=x",
        "/exchanges",
        "/bindings",
        "/policies",
    ] {
        let (status, head, _) = http(
            &address,
            format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n"),
        )
        .await?;
        ensure!(status == 303, "GET {path}: {status}\n{head}");
        ensure!(
            header(&head, "location") == Some("/login"),
            "GET {path}: {head}"
        );
    }
    // A forged cookie is no session.
    let (status, head, _) = http(
        &address,
        format!(
            "GET / HTTP/1.0\r\nHost: {address}\r\nCookie: qq_session=0123456789abcdef0123456789abcdef\r\n\r\n"
        ),
    )
    .await?;
    ensure!(status == 303, "forged cookie: {status}\n{head}");

    let (status, head, body) = http(
        &address,
        format!("GET /login HTTP/1.0\r\nHost: {address}\r\n\r\n"),
    )
    .await?;
    ensure!(
        status == 200 && body.contains("name=\"password\""),
        "{head}\n{body}"
    );
    ensure!(
        header(&head, "content-security-policy").is_some_and(|v| v.contains("default-src 'none'")),
        "{head}"
    );

    info!("--- a wrong password: 401, no cookie; the right one: a session cookie");
    let form = "username=guest&password=wrong";
    let (status, head, body) = http(
        &address,
        format!(
            "POST /login HTTP/1.0\r\nHost: {address}\r\nContent-Type: \
             application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{form}",
            form.len()
        ),
    )
    .await?;
    ensure!(status == 401, "{status}\n{head}\n{body}");
    ensure!(header(&head, "set-cookie").is_none(), "{head}");
    ensure!(body.contains("invalid credentials for user"), "{body}");
    let form = "username=guest&password=guest";
    let (status, head, _) = http(
        &address,
        format!(
            "POST /login HTTP/1.0\r\nHost: {address}\r\nContent-Type: \
             application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{form}",
            form.len()
        ),
    )
    .await?;
    ensure!(status == 303, "{status}\n{head}");
    let cookie = header(&head, "set-cookie").context("no session cookie")?;
    ensure!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let token = cookie.split(';').next().unwrap_or_default().to_string();
    let (status, _, body) = http(
        &address,
        format!("GET / HTTP/1.0\r\nHost: {address}\r\nCookie: {token}\r\n\r\n"),
    )
    .await?;
    ensure!(
        status == 200 && body.contains("id=\"nodes\""),
        "{status}\n{body}"
    );
    // /metrics and /healthz stay without credentials.
    let (status, _) = cluster.http_get(1, "/healthz").await?;
    ensure!(status == 200);
    cluster.stop();
    Ok(())
}

/// Opens `url` and returns the text of the element at `css` once `check` accepts it (views
/// reload themselves, so each try loads the page again).
async fn text_when(
    b: &Browser,
    url: &str,
    css: &str,
    what: &str,
    check: impl Fn(&str) -> bool,
) -> anyhow::Result<String> {
    let check = &check;
    eventually(what, WAIT, || async move {
        b.goto(url).await?;
        let text = b.text(css).await?;
        if check(&text) {
            Ok(Some(text))
        } else {
            bail!("{css} on {url}: {text:?}")
        }
    })
    .await
}

/// Waits until a navigation (a form's submit) has reached `path`.
async fn wait_path(b: &Browser, path: &str) -> anyhow::Result<()> {
    eventually(&format!("the browser at {path}"), WAIT, || async {
        let at = b.path().await?;
        if at == path {
            Ok(Some(()))
        } else {
            bail!("at {at}")
        }
    })
    .await
}

async fn log_in(b: &Browser, base: &str, user: &str, password: &str) -> anyhow::Result<()> {
    b.goto(&format!("{base}/login")).await?;
    b.find("#username").await?.send_keys(user).await?;
    b.find("#password").await?.send_keys(password).await?;
    b.find("#login").await?.click().await?;
    Ok(())
}

async fn declare_topology(admin: &Client) -> anyhow::Result<()> {
    admin.declare_exchange("page.dlx", "direct").await?;
    admin.declare_queue("page.dlq", HashMap::new()).await?;
    admin
        .bind("page.dlq", "page.dlx", "page.dead", HashMap::new())
        .await?;
    admin
        .declare_queue(
            "page.work",
            table([
                ("x-dead-letter-exchange", Value::string("page.dlx")),
                ("x-dead-letter-routing-key", Value::string("page.dead")),
                ("x-message-ttl", Value::long(600_000)),
                ("x-max-length", Value::long(1000)),
                ("x-delivery-limit", Value::long(5)),
            ]),
        )
        .await?;
    admin
        .set_policy(
            "cap",
            "^page\\.capped$",
            "queues",
            0,
            table([("max-length", Value::long(50))]),
        )
        .await?;
    admin.declare_queue("page.capped", HashMap::new()).await?;
    // One message rejected with a reason: it dies into page.dlq.
    admin
        .publish("", "page.work", message("order without customer"))
        .await?;
    let mut consumer = admin.consume("page.work", 1).await?;
    let d = consumer
        .next_timeout(WAIT)
        .await?
        .context("no delivery from page.work")?;
    consumer
        .reject_with_reason(d.delivery_tag, "missing customer id")
        .await?;
    // Cancel, then read to the stream's end, so the reject is applied before the stream ends.
    consumer.cancel().await?;
    while let Some(d) = tokio::time::timeout(WAIT, consumer.next())
        .await
        .context("the consume stream did not end after cancel")?
    {
        d?;
    }
    eventually("the dead letter in page.dlq", WAIT, || async {
        let q = admin.get_queue("page.dlq").await?;
        Ok((q.messages_ready == 1).then_some(()))
    })
    .await?;
    // Another vhost with a queue only administrators (and guest, given access) see.
    admin.put_vhost("other").await?;
    admin
        .set_permissions("guest", "other", ".*", ".*", ".*")
        .await?;
    admin
        .clone()
        .with_vhost("other")
        .declare_queue("other.secret", HashMap::new())
        .await?;
    // A user with access to "/" only.
    admin.put_user("viewer", "viewer-pw", vec![]).await?;
    admin.set_permissions("viewer", "/", "", "", ".*").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_sees_the_dead_lettering_topology_on_the_page() -> anyhow::Result<()> {
    let profile = tempfile::Builder::new().prefix("qq-page-").tempdir()?;
    // A missing browser fails at once, naming `make deps`.
    qq_tests::webdriver::check_installed()?;
    // The cluster first: Chromium's own connections could take a port the cluster chose.
    let cluster = TestCluster::start(3).await?;
    let b = Browser::start(profile.path()).await?;
    let admin = cluster.client(1).await?;
    info!("--- a dead-lettering topology, a policy, a rejected message, another vhost");
    declare_topology(&admin).await?;
    let base = format!("http://{}", cluster.http_address(2));

    info!("--- no session: the page sends the browser to /login; a wrong password is refused");
    b.goto(&format!("{base}/")).await?;
    let at = b.path().await?;
    ensure!(at == "/login", "at {at}");
    log_in(&b, &base, "guest", "not-the-password").await?;
    // The click submits the form; the answer is a new page (still /login).
    let error = eventually("the login error", WAIT, || async {
        Ok(b.text("#error").await.ok())
    })
    .await?;
    ensure!(
        error.contains("invalid credentials for user 'guest'"),
        "{error}"
    );
    ensure!(b.path().await? == "/login");

    info!("--- the administrator logs in and sees the nodes");
    log_in(&b, &base, "guest", "guest").await?;
    wait_path(&b, "/").await?;
    let nodes = text_when(
        &b,
        &format!("{base}/"),
        "#nodes",
        "three reachable nodes",
        |t| {
            t.lines()
                .skip(1)
                .filter(|row| row.contains(" yes "))
                .count()
                == 3
        },
    )
    .await?;
    ensure!(nodes.contains("this node"), "{nodes}");
    let health = b.text("#health").await?;
    ensure!(health == "SERVING", "{health}");

    info!("--- the queues, with their feature tags");
    let queues_url = format!("{base}/queues?vhost=%2F");
    let features = text_when(
        &b,
        &queues_url,
        "tr[data-queue='page.work'] td.features",
        "page.work's feature tags",
        |t| {
            ["DLX", "DLK", "TTL", "Lim", "D-Lim"]
                .iter()
                .all(|tag| t.split_whitespace().any(|w| w == *tag))
        },
    )
    .await?;
    info!(%features, "page.work");
    let capped = b.text("tr[data-queue='page.capped'] td.features").await?;
    ensure!(
        capped.split_whitespace().any(|w| w == "Lim") && capped.contains("Pol cap"),
        "page.capped: {capped:?}"
    );
    let dlq_row = b.text("tr[data-queue='page.dlq']").await?;
    ensure!(!dlq_row.contains("DLX"), "page.dlq has no DLX: {dlq_row:?}");

    info!("--- one queue: effective settings and who set them, the dead-letter target");
    let work_url = format!("{base}/queue?vhost=%2F&name=page.work");
    let settings = text_when(&b, &work_url, "#settings", "page.work's settings", |t| {
        t.contains("max-length 1000 argument")
    })
    .await?;
    ensure!(
        settings.contains("dead-letter-exchange page.dlx argument"),
        "{settings}"
    );
    ensure!(
        settings.contains("message-ttl 600000 ms argument"),
        "{settings}"
    );
    let target = b.text("#dead-letter-target").await?;
    ensure!(
        target.contains("page.dlx") && target.contains("page.dead") && target.contains("page.dlq"),
        "{target}"
    );
    let capped_url = format!("{base}/queue?vhost=%2F&name=page.capped");
    text_when(
        &b,
        &capped_url,
        "tr[data-setting='max-length']",
        "page.capped's max-length",
        |t| t.contains("50") && t.contains("policy cap"),
    )
    .await?;

    info!("--- the DLQ: its messages' x-death reasons by count");
    let dlq_url = format!("{base}/queue?vhost=%2F&name=page.dlq");
    let reasons = text_when(
        &b,
        &dlq_url,
        "#x-death-reasons tr[data-reason='rejected']",
        "page.dlq's x-death reasons",
        |t| t.contains("page.work"),
    )
    .await?;
    let cells: Vec<&str> = reasons.split_whitespace().collect();
    ensure!(
        cells == ["rejected", "page.work", "1", "1"],
        "x-death row: {reasons:?}"
    );
    let details = b.text("#x-death-details").await?;
    ensure!(details.contains("missing customer id"), "{details}");
    if let Ok(path) = std::env::var("QQ_PAGE_SCREENSHOT") {
        std::fs::write(&path, b.screenshot().await?)?;
    }

    info!("--- exchanges, bindings, policies");
    text_when(
        &b,
        &format!("{base}/exchanges?vhost=%2F"),
        "#exchanges",
        "exchanges",
        |t| t.contains("page.dlx") && t.contains("direct"),
    )
    .await?;
    text_when(
        &b,
        &format!("{base}/bindings?vhost=%2F"),
        "#bindings",
        "bindings",
        |t| t.contains("page.dlx page.dlq page.dead"),
    )
    .await?;
    text_when(
        &b,
        &format!("{base}/policies?vhost=%2F"),
        "#policies",
        "policies",
        |t| t.contains("cap") && t.contains("max-length=50"),
    )
    .await?;

    info!("--- the administrator sees the other vhost");
    text_when(
        &b,
        &format!("{base}/queues?vhost=other"),
        "#queues",
        "other.secret for the administrator",
        |t| t.contains("other.secret"),
    )
    .await?;

    info!("--- a user with access to / only does not see it");
    b.find("header form button").await?.click().await?;
    wait_path(&b, "/login").await?;
    log_in(&b, &base, "viewer", "viewer-pw").await?;
    wait_path(&b, "/").await?;
    let mine = text_when(&b, &queues_url, "#queues", "viewer's queues", |t| {
        t.contains("page.work")
    })
    .await?;
    ensure!(!mine.contains("other.secret"), "{mine}");
    let vhosts = b.text("p.vhosts").await?;
    ensure!(!vhosts.contains("other"), "viewer's vhost list: {vhosts}");
    b.goto(&format!("{base}/queues?vhost=other")).await?;
    let refused = b.text("#error").await?;
    ensure!(
        refused.contains("PermissionDenied") && refused.contains("refused for user 'viewer'"),
        "{refused}"
    );
    ensure!(!b.source().await?.contains("other.secret"));
    // The overview's totals count only what the viewer may see (page.* in /: 3 queues).
    let totals = text_when(&b, &format!("{base}/"), "#totals", "viewer's totals", |t| {
        !t.is_empty()
    })
    .await?;
    let first_row: Vec<&str> = totals
        .lines()
        .nth(1)
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default();
    ensure!(
        first_row.first() == Some(&"3"),
        "viewer's totals: {totals:?}"
    );

    drop(b);
    cluster.stop();
    Ok(())
}
