//! What the banner of `likes-local serve` says about faults: none unless
//! asked for (and how to ask), else which variable asks for which, and
//! where each acts.

use super::Stack;
use likes::Counting;

/// The faults a stack was started with, each as its variable gave it
/// (trimmed; `None` when unset or empty).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FaultSettings {
    /// `FAULTS`, when it asks for any fault: the fault proxy's, in front of
    /// DynamoDB and, with a views stream, of Kinesis.
    pub proxy: Option<String>,
    /// `LOCAL_STREAM_FAULTS`: the event source of the Likes table's stream
    /// (stream mode), and the views one's unless `LOCAL_VIEWS_FAULTS`.
    pub stream_source: Option<String>,
    /// `LOCAL_VIEWS_FAULTS`: the views stream's event source.
    pub views_source: Option<String>,
}

impl FaultSettings {
    /// Whether nothing asks for a fault.
    pub fn is_none(&self) -> bool {
        *self == FaultSettings::default()
    }
}

/// What runs, for [`fault_lines`].
struct Running<'a> {
    /// The fault proxy in front of DynamoDB, if any.
    proxy: Option<&'a str>,
    /// The one in front of the views stream, if any.
    kinesis_proxy: Option<&'a str>,
    /// Stream mode: the Likes table's stream has an event source.
    stream_source: bool,
    /// A views stream, with its event source.
    views: bool,
}

impl Stack {
    /// The banner's `faults:` entry, a line each: none unless asked for
    /// (and how to ask), else what each variable asked for and where it
    /// acts.
    pub fn fault_lines(&self) -> Vec<String> {
        fault_lines(
            &self.faults,
            &Running {
                proxy: self.proxy.as_ref().map(|p| p.url.as_str()),
                kinesis_proxy: self.kinesis_proxy.as_ref().map(|p| p.url.as_str()),
                stream_source: self.config.counting == Counting::Stream,
                views: self.views.is_some(),
            },
        )
    }
}

/// How to ask for faults, after "none".
const HOW_TO_ASK: &str = "ask with FAULTS='seed=7,all=0.05' make serve (DynamoDB and Kinesis requests), \
LOCAL_STREAM_FAULTS or LOCAL_VIEWS_FAULTS (the stream event sources), or the playground's \
\"lose a shard\"; docs/hostile-input.md";

fn fault_lines(faults: &FaultSettings, running: &Running) -> Vec<String> {
    let stats = |url: &str| format!("stats: curl {url}/__proxy/stats");
    let mut lines = Vec::new();
    if faults.is_none() {
        lines.push(match running.proxy {
            Some(url) => format!(
                "none: the fault proxy {url} passes everything through; {}",
                stats(url)
            ),
            None => "none: the functions reach DynamoDB directly".to_owned(),
        });
        lines.push(HOW_TO_ASK.to_owned());
        return lines;
    }
    match (&faults.proxy, running.proxy) {
        (Some(spec), Some(url)) => {
            let kinesis = running
                .kinesis_proxy
                .map(|k| format!(", and Kinesis through {k}"))
                .unwrap_or_default();
            lines.push(format!(
                "FAULTS='{spec}': the functions reach DynamoDB through the fault proxy {url}{kinesis}; {}",
                stats(url)
            ));
        }
        // Not a case Stack::start makes: FAULTS starts a proxy.
        (Some(spec), None) => lines.push(format!("FAULTS='{spec}': no fault proxy runs")),
        (None, Some(url)) => lines.push(format!(
            "FAULTS unset: the fault proxy {url} passes everything through (until the playground loses a shard); {}",
            stats(url)
        )),
        (None, None) => {}
    }
    if let Some(spec) = &faults.stream_source {
        let mut acts = Vec::new();
        if running.stream_source {
            acts.push("the Likes table's stream event source");
        }
        if running.views && faults.views_source.is_none() {
            acts.push("the views stream's event source (LOCAL_VIEWS_FAULTS unset)");
        }
        lines.push(if acts.is_empty() {
            format!(
                "LOCAL_STREAM_FAULTS='{spec}': no effect (no stream event source: COUNTING=stream runs one)"
            )
        } else {
            format!("LOCAL_STREAM_FAULTS='{spec}': {}", acts.join(", and "))
        });
    }
    if let Some(spec) = &faults.views_source {
        lines.push(if running.views {
            format!("LOCAL_VIEWS_FAULTS='{spec}': the views stream's event source")
        } else {
            format!("LOCAL_VIEWS_FAULTS='{spec}': no effect (no views stream: LOCAL_VIEWS=off)")
        });
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAYGROUND: Running = Running {
        proxy: Some("http://127.0.0.1:1"),
        kinesis_proxy: None,
        stream_source: false,
        views: true,
    };

    #[test]
    fn no_faults_says_none_and_how_to_ask() {
        let lines = fault_lines(&FaultSettings::default(), &PLAYGROUND);
        assert_eq!(
            lines[0],
            "none: the fault proxy http://127.0.0.1:1 passes everything through; \
             stats: curl http://127.0.0.1:1/__proxy/stats"
        );
        assert!(lines[1].contains("FAULTS='seed=7,all=0.05'"), "{lines:?}");
        assert!(lines[1].contains("LOCAL_STREAM_FAULTS"), "{lines:?}");
        assert!(lines[1].contains("LOCAL_VIEWS_FAULTS"), "{lines:?}");
        assert_eq!(lines.len(), 2);
    }

    #[test]
    fn faults_say_which_and_where() {
        let faults = FaultSettings {
            proxy: Some("seed=7,all=0.05".into()),
            stream_source: Some("seed=5,reorder=0.5".into()),
            views_source: None,
        };
        let running = Running {
            kinesis_proxy: Some("http://127.0.0.1:2"),
            stream_source: true,
            ..PLAYGROUND
        };
        let lines = fault_lines(&faults, &running);
        assert_eq!(
            lines,
            [
                "FAULTS='seed=7,all=0.05': the functions reach DynamoDB through the fault proxy \
                 http://127.0.0.1:1, and Kinesis through http://127.0.0.1:2; \
                 stats: curl http://127.0.0.1:1/__proxy/stats",
                "LOCAL_STREAM_FAULTS='seed=5,reorder=0.5': the Likes table's stream event source, \
                 and the views stream's event source (LOCAL_VIEWS_FAULTS unset)",
            ]
        );
    }

    #[test]
    fn source_faults_without_their_source_have_no_effect() {
        let faults = FaultSettings {
            proxy: None,
            stream_source: Some("lost=0.1".into()),
            views_source: Some("duplicate=1".into()),
        };
        let running = Running {
            views: false,
            ..PLAYGROUND
        };
        let lines = fault_lines(&faults, &running);
        assert!(
            lines[0].starts_with("FAULTS unset: the fault proxy"),
            "{lines:?}"
        );
        assert!(lines[1].contains("no effect"), "{lines:?}");
        assert!(lines[2].contains("no effect (no views stream"), "{lines:?}");
    }
}
