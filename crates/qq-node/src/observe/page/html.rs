//! HTML building blocks of the management page: escaping, links, the layout around every
//! view, values and feature tags.
//!
//! Every string that comes from the broker's state or the request (queue, exchange, user and
//! vhost names, arguments, headers, reason details) is user input: it reaches the page only
//! through [`esc`] (text and attribute values) or [`url`] (query values, then escaped). The
//! page carries no script and loads nothing from elsewhere (one inline style sheet); the
//! Content-Security-Policy of [`super`] forbids anything else.

use std::fmt::Write;

use qq_core::{Table, Value};

/// How often a signed-in view reloads itself.
pub const REFRESH_SECONDS: u32 = 5;

/// `s` escaped for HTML text and double- or single-quoted attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `s` percent-encoded for a query value (not yet HTML-escaped).
pub fn url(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// A link to `path` with query `params`, the text `text` (both escaped here).
pub fn link(path: &str, params: &[(&str, &str)], text: &str) -> String {
    format!("<a href=\"{}\">{}</a>", esc(&href(path, params)), esc(text))
}

/// `path?k=v&...`, values percent-encoded.
pub fn href(path: &str, params: &[(&str, &str)]) -> String {
    let mut out = path.to_string();
    for (i, (k, v)) in params.iter().enumerate() {
        out.push(if i == 0 { '?' } else { '&' });
        out.push_str(k);
        out.push('=');
        out.push_str(&url(v));
    }
    out
}

/// The sections of the navigation bar.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Section {
    Overview,
    Queues,
    Exchanges,
    Bindings,
    Policies,
}

const SECTIONS: [(Section, &str, &str); 5] = [
    (Section::Overview, "/", "Overview"),
    (Section::Queues, "/queues", "Queues"),
    (Section::Exchanges, "/exchanges", "Exchanges"),
    (Section::Bindings, "/bindings", "Bindings"),
    (Section::Policies, "/policies", "Policies"),
];

/// Who is signed in and which vhosts they may see (for the navigation bar).
pub struct Nav<'a> {
    pub user: &'a str,
    pub node_id: u64,
    pub section: Section,
    /// The vhost the view shows (None: a view across vhosts).
    pub vhost: Option<&'a str>,
    pub vhosts: &'a [String],
}

const STYLE: &str = "body{font-family:sans-serif;margin:0;color:#222;font-size:14px}\
header{background:#2d3e50;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center;flex-wrap:wrap}\
header a{color:#fff;text-decoration:none}header a.on{border-bottom:2px solid #f60}\
header form{margin:0}header .who{margin-left:auto}main{padding:12px 16px}\
table{border-collapse:collapse;margin:8px 0 16px}th,td{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}\
th{background:#eef}td.n{text-align:right}.tag{display:inline-block;background:#e8f0fe;border:1px solid #9ab;\
border-radius:3px;padding:0 4px;margin:0 2px;font-size:12px}.bad{color:#b00;font-weight:bold}.ok{color:#070}\
.note{color:#666}.vhosts a{margin-right:8px}.vhosts a.on{font-weight:bold}\
.login{max-width:320px;margin:60px auto}.login input{display:block;width:100%;margin:4px 0 12px}";

/// A whole page: title, the navigation (when signed in), `body`; reloads itself every
/// [`REFRESH_SECONDS`] when `refresh`.
pub fn layout(title: &str, nav: Option<&Nav<'_>>, body: &str, refresh: bool) -> String {
    let mut out = String::with_capacity(body.len() + 2048);
    out.push_str("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">");
    if refresh {
        let _ = write!(
            out,
            "<meta http-equiv=\"refresh\" content=\"{REFRESH_SECONDS}\">"
        );
    }
    let _ = write!(
        out,
        "<title>{} - quorumq</title><style>{STYLE}</style></head><body>",
        esc(title)
    );
    if let Some(nav) = nav {
        out.push_str("<header><strong>quorumq</strong>");
        for (section, path, name) in SECTIONS {
            let params: Vec<(&str, &str)> = match (section, nav.vhost) {
                (Section::Overview, _) | (_, None) => vec![],
                (_, Some(v)) => vec![("vhost", v)],
            };
            let class = if section == nav.section {
                " class=\"on\""
            } else {
                ""
            };
            let _ = write!(
                out,
                "<a{class} href=\"{}\">{name}</a>",
                esc(&href(path, &params))
            );
        }
        let _ = write!(
            out,
            "<span class=\"who\">node {} &middot; user <span id=\"user\">{}</span></span>\
             <form method=\"post\" action=\"/logout\"><button type=\"submit\">Log out</button></form>\
             </header><main>",
            nav.node_id,
            esc(nav.user)
        );
        if let Some(current) = nav.vhost {
            let path = SECTIONS
                .iter()
                .find(|(s, _, _)| *s == nav.section)
                .map_or("/queues", |(_, p, _)| *p);
            out.push_str("<p class=\"vhosts\">Virtual host: ");
            for v in nav.vhosts {
                let class = if v == current { " class=\"on\"" } else { "" };
                let _ = write!(
                    out,
                    "<a{class} href=\"{}\">{}</a>",
                    esc(&href(path, &[("vhost", v)])),
                    esc(v)
                );
            }
            out.push_str("</p>");
        }
    } else {
        out.push_str("<main>");
    }
    let _ = write!(out, "<h1>{}</h1>", esc(title));
    out.push_str(body);
    if refresh {
        let _ = write!(
            out,
            "<p class=\"note\">This page reloads every {REFRESH_SECONDS} s.</p>"
        );
    }
    out.push_str("</main></body></html>");
    out
}

/// A value as text (not escaped).
pub fn value(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Long(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Double(d) => d.to_string(),
        Value::Bytes(b) => format!("({} bytes)", b.len()),
        Value::Timestamp(t) => format!("timestamp {t}"),
        Value::List(items) => format!(
            "[{}]",
            items.iter().map(value).collect::<Vec<_>>().join(", ")
        ),
        Value::Table(t) => format!("{{{}}}", table(t)),
        Value::Void => "void".to_string(),
    }
}

/// A table as `k=v, ...` text (not escaped).
pub fn table(t: &Table) -> String {
    t.iter()
        .map(|(k, v)| format!("{k}={}", value(v)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A feature tag: short `name`, the full setting and value in its title.
pub fn tag(name: &str, title: &str) -> String {
    format!(
        "<span class=\"tag\" title=\"{}\">{}</span>",
        esc(title),
        esc(name)
    )
}

/// A number of bytes, human-readable.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_strings_cannot_break_out_of_text_or_attributes() {
        let evil = "<script>alert('x')</script>\"&";
        let escaped = esc(evil);
        assert!(!escaped.contains('<') && !escaped.contains('"') && !escaped.contains('\''));
        assert_eq!(
            escaped,
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&quot;&amp;"
        );
        let a = link("/queue", &[("vhost", "/"), ("name", "a&b \"c\"")], evil);
        assert_eq!(
            a,
            "<a href=\"/queue?vhost=%2F&amp;name=a%26b+%22c%22\">\
             &lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&quot;&amp;</a>"
        );
    }

    #[test]
    fn values_read_as_text() {
        let t: Table = [
            ("a".to_string(), Value::Long(1)),
            (
                "b".to_string(),
                Value::List(vec![Value::String("x".into()), Value::Bool(true)]),
            ),
        ]
        .into_iter()
        .collect();
        assert_eq!(table(&t), "a=1, b=[x, true]");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
    }
}
