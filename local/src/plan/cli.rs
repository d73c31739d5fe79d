//! `likes-local plan` on the command line: its usage, the parsing of its
//! flags into [`Inputs`], and the text it prints (the table or JSON). Apart
//! from the planner so that the flags' spelling and the output's framing
//! (the `elapsed_ms` the library's pure [`plan`] cannot know) stay out of
//! the maths.

use super::render::render_table;
use super::{Inputs, PlanError, plan};

/// The usage of `likes-local plan`.
pub const USAGE: &str = "\
usage: likes-local plan [--peak N] [--cap N] [--headroom F] [--units 1|2] [--shards N]
                        [--seconds N] [--seed N] [--reads N] [--cache-ttl-ms N]
                        [--instances N] [--json]

Shard count for a planned peak, shards = ceil(peak × (1 + headroom) × units / cap),
checked by simulating random shard choice second by second.

  --peak N          planned peak, likes/s on one reel (default 14000)
  --cap N           per-partition cap, write units/s (default 1000)
  --headroom F      plan for peak × (1 + F) (default 0.3)
  --units 1|2       write units a like costs on its shard: 2 = the product's
                    transactional update (default), 1 = a plain counter
  --shards N        check N shards instead of the rule's count (1..=1000)
  --seconds N       seconds simulated (default 2000)
  --seed N          random seed (default 1)
  --reads N         reads/s of the reel's count (default 50000)
  --cache-ttl-ms N  count cache TTL, ms; 0 = no cache (default 2000)
  --instances N     function instances, each with its own cache (default 40)
  --json            print JSON instead of the table
";

/// What the command line asked for.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Plan for `inputs` (validated); print JSON when `json`, else the
    /// table.
    Plan {
        /// What to plan for: the defaults with the flags given applied.
        inputs: Inputs,
        /// `--json` was given.
        json: bool,
    },
    /// `-h` or `--help`: print [`USAGE`].
    Help,
}

/// Parses the arguments after `plan` (`--flag value` or `--flag=value`).
pub fn parse_args(args: &[String]) -> Result<Command, PlanError> {
    let mut inputs = Inputs::default();
    let mut json = false;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_owned())),
            _ => (arg.as_str(), None),
        };
        match flag {
            "-h" | "--help" => return Ok(Command::Help),
            "--json" => {
                json = true;
                continue;
            }
            _ => {}
        }
        let field: &'static str = match flag {
            "--peak" => "peak",
            "--cap" => "cap",
            "--headroom" => "headroom",
            "--units" => "units",
            "--shards" => "shards",
            "--seconds" => "seconds",
            "--seed" => "seed",
            "--reads" => "reads",
            "--cache-ttl-ms" => "cache-ttl-ms",
            "--instances" => "instances",
            other => {
                return Err(PlanError::new(
                    "args",
                    format!("unknown argument {other:?}; see likes-local plan --help"),
                ));
            }
        };
        let value = match inline.or_else(|| it.next().cloned()) {
            Some(v) => v,
            None => return Err(PlanError::new(field, "needs a value")),
        };
        let bad = |what: &str| PlanError::new(field, format!("{value:?} is not {what}"));
        let float = || {
            value
                .trim()
                .replace('_', "")
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite())
                .ok_or_else(|| bad("a number"))
        };
        let whole = || {
            value
                .trim()
                .replace('_', "")
                .parse::<u64>()
                .map_err(|_| bad("a whole number"))
        };
        let small = || whole().and_then(|n| u32::try_from(n).map_err(|_| bad("that small")));
        match field {
            "peak" => inputs.peak = float()?,
            "cap" => inputs.cap = float()?,
            "headroom" => inputs.headroom = float()?,
            "units" => inputs.units = small()?,
            "shards" => inputs.shards = Some(small()?),
            "seconds" => inputs.seconds = small()?,
            "seed" => inputs.seed = whole()?,
            "reads" => inputs.reads = float()?,
            "cache-ttl-ms" => inputs.cache_ttl_ms = whole()?,
            "instances" => inputs.instances = small()?,
            _ => unreachable!("every field is matched above"),
        }
    }
    inputs.validate()?;
    Ok(Command::Plan { inputs, json })
}

/// `likes-local plan ARGS`: the text to print (table, JSON or usage). Times
/// the planning (simulation and exact law) and reports it as `elapsed_ms`.
pub fn run_cli(args: &[String]) -> Result<String, PlanError> {
    match parse_args(args)? {
        Command::Help => Ok(USAGE.to_owned()),
        Command::Plan { inputs, json } => {
            let started = std::time::Instant::now();
            let plan = plan(&inputs)?;
            let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
            Ok(if json {
                let mut v = serde_json::to_value(&plan).unwrap_or_default();
                if let Some(map) = v.as_object_mut() {
                    map.insert(
                        "elapsed_ms".into(),
                        serde_json::json!((elapsed_ms * 1000.0).round() / 1000.0),
                    );
                }
                let mut s = serde_json::to_string_pretty(&v).unwrap_or_default();
                s.push('\n');
                s
            } else {
                render_table(&plan, Some(elapsed_ms))
            })
        }
    }
}
