//! Windowed counts' buckets (issue 37): the attributes a count item carries
//! beside its all-time count, and the windows read from them.
//!
//! A change is counted, by the same write that counts it for all time, in
//! one bucket of each [`Grain`]: `cm{index}` (5 minutes), `ch{index}` (an
//! hour), `cd{index}` (a UTC day), where the bucket starts at `index ×
//! width` (Unix ms). So windowed counts are exactly once wherever the
//! all-time count is, and cost no item of their own: a few attributes on
//! items written anyway.
//!
//! Each [`Window`] is read from one grain: every bucket from
//! [`Window::from_ms`] on, so the window covers at least its length and
//! less than its length plus one bucket (the answer says from when). Items
//! keep [`Grain::kept`] buckets of a grain; every write removes the
//! [`Grain::pruned`] before those, and a reader skips any older one it
//! finds, so a count never relies on the removal having run.

/// The width of a bucket of windowed counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Grain {
    /// Five minutes: the last hour.
    Minutes5,
    /// An hour: the last 24 hours.
    Hour,
    /// A UTC day: the last 7 days.
    Day,
}

impl Grain {
    /// Every grain, finest first.
    pub const ALL: [Grain; 3] = [Grain::Minutes5, Grain::Hour, Grain::Day];

    /// A bucket's width (ms).
    pub const fn width_ms(self) -> i64 {
        match self {
            Grain::Minutes5 => 300_000,
            Grain::Hour => 3_600_000,
            Grain::Day => 86_400_000,
        }
    }

    /// The letter after `c` in its attributes' names.
    const fn letter(self) -> char {
        match self {
            Grain::Minutes5 => 'm',
            Grain::Hour => 'h',
            Grain::Day => 'd',
        }
    }

    /// The window read from it.
    pub const fn window(self) -> Window {
        match self {
            Grain::Minutes5 => Window::Hour,
            Grain::Hour => Window::Day,
            Grain::Day => Window::Week,
        }
    }

    /// Buckets an item keeps: those of its window (the current one, partly
    /// elapsed, and as many whole ones as the window is long).
    pub const fn kept(self) -> i64 {
        self.window().len_ms() / self.width_ms() + 1
    }

    /// Buckets older than the kept ones that every write removes: a bucket
    /// is left behind only by an item not written for this many buckets
    /// after it expired (an hour, eight hours, four days), and readers
    /// skip it.
    pub const fn pruned(self) -> i64 {
        match self {
            Grain::Minutes5 => 12,
            Grain::Hour => 8,
            Grain::Day => 4,
        }
    }

    /// The start (Unix ms) of the bucket holding `at_ms`.
    pub const fn start_of(self, at_ms: i64) -> i64 {
        at_ms.div_euclid(self.width_ms()) * self.width_ms()
    }

    /// The oldest bucket start an item keeps at `now_ms`.
    pub const fn kept_from(self, now_ms: i64) -> i64 {
        self.start_of(now_ms) - (self.kept() - 1) * self.width_ms()
    }
}

/// A window of the windowed counts, as the API names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Window {
    /// `1h`.
    Hour,
    /// `24h`.
    Day,
    /// `7d`.
    Week,
}

impl Window {
    /// Every window, shortest first.
    pub const ALL: [Window; 3] = [Window::Hour, Window::Day, Window::Week];

    /// Its name in the API.
    pub const fn name(self) -> &'static str {
        match self {
            Window::Hour => "1h",
            Window::Day => "24h",
            Window::Week => "7d",
        }
    }

    /// The window a name in the API stands for.
    pub fn parse(name: &str) -> Option<Window> {
        Window::ALL.into_iter().find(|w| w.name() == name)
    }

    /// Its length (ms).
    pub const fn len_ms(self) -> i64 {
        match self {
            Window::Hour => 3_600_000,
            Window::Day => 86_400_000,
            Window::Week => 7 * 86_400_000,
        }
    }

    /// The grain it is read from.
    pub const fn grain(self) -> Grain {
        match self {
            Window::Hour => Grain::Minutes5,
            Window::Day => Grain::Hour,
            Window::Week => Grain::Day,
        }
    }

    /// Where it starts at `now_ms`: the start of its oldest bucket, at or
    /// before `now_ms` less its length.
    pub const fn from_ms(self, now_ms: i64) -> i64 {
        self.grain().kept_from(now_ms)
    }
}

/// The attribute of `grain`'s bucket that holds `at_ms`.
pub fn attr(grain: Grain, at_ms: i64) -> String {
    format!("c{}{}", grain.letter(), at_ms.div_euclid(grain.width_ms()))
}

/// The grain and start (Unix ms) of a bucket attribute; `None` for any
/// other name.
pub fn parse_attr(name: &str) -> Option<(Grain, i64)> {
    let rest = name.strip_prefix('c')?;
    let mut chars = rest.chars();
    let grain = match chars.next()? {
        'm' => Grain::Minutes5,
        'h' => Grain::Hour,
        'd' => Grain::Day,
        _ => return None,
    };
    let digits = chars.as_str();
    if digits.is_empty() || digits.len() > 12 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let index: i64 = digits.parse().ok()?;
    Some((grain, index.checked_mul(grain.width_ms())?))
}

/// Whether a bucket of `grain` starting at `start_ms` is still kept at
/// `now_ms`.
pub const fn is_kept(grain: Grain, start_ms: i64, now_ms: i64) -> bool {
    start_ms >= grain.kept_from(now_ms)
}

/// The buckets a change made at `at_ms` is counted in by a write at
/// `now_ms`: one per grain, those still kept (a change older than a
/// grain's window is in none of its buckets, and in the all-time count).
pub fn buckets_of(at_ms: i64, now_ms: i64) -> impl Iterator<Item = String> {
    Grain::ALL
        .into_iter()
        .filter(move |g| is_kept(*g, g.start_of(at_ms), now_ms))
        .map(move |g| attr(g, at_ms))
}

/// The attributes a write at `now_ms` removes: each grain's
/// [`Grain::pruned`] buckets before the kept ones. None of them is ever
/// one the same write adds to.
pub fn pruned_attrs(now_ms: i64) -> Vec<String> {
    let mut out = Vec::new();
    for g in Grain::ALL {
        let from = g.kept_from(now_ms);
        for k in 1..=g.pruned() {
            out.push(attr(g, from - k * g.width_ms()));
        }
    }
    out
}

/// What count items say over each window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WindowCounts {
    /// The last hour's net change.
    pub hour: i64,
    /// The last 24 hours'.
    pub day: i64,
    /// The last 7 days'.
    pub week: i64,
}

impl WindowCounts {
    /// Adds attribute `name`'s `value` if it is a bucket inside its window
    /// at `now_ms`; whether it is a bucket attribute at all.
    pub fn add_attr(&mut self, name: &str, value: i64, now_ms: i64) -> bool {
        let Some((grain, start)) = parse_attr(name) else {
            return false;
        };
        // A bucket after `now_ms` (a writer's clock ahead of the
        // reader's) is counted: its changes happened.
        if is_kept(grain, start, now_ms) {
            let slot = self.slot(grain.window());
            *slot = slot.saturating_add(value);
        }
        true
    }

    /// Adds another's counts.
    pub fn merge(&mut self, other: &WindowCounts) {
        for w in Window::ALL {
            let v = other.get(w);
            let slot = self.slot(w);
            *slot = slot.saturating_add(v);
        }
    }

    /// The count over `window`.
    pub const fn get(&self, window: Window) -> i64 {
        match window {
            Window::Hour => self.hour,
            Window::Day => self.day,
            Window::Week => self.week,
        }
    }

    fn slot(&mut self, window: Window) -> &mut i64 {
        match window {
            Window::Hour => &mut self.hour,
            Window::Day => &mut self.day,
            Window::Week => &mut self.week,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;
    const HOUR: i64 = 60 * MIN;
    const DAY: i64 = 24 * HOUR;

    #[test]
    fn names_are_pinned_and_parse_back() {
        // 2026-12-07T08:41:30Z.
        let at = 1_796_632_890_000;
        assert_eq!(attr(Grain::Minutes5, at), "cm5988776");
        assert_eq!(attr(Grain::Hour, at), "ch499064");
        assert_eq!(attr(Grain::Day, at), "cd20794");
        for g in Grain::ALL {
            assert_eq!(parse_attr(&attr(g, at)), Some((g, g.start_of(at))));
        }
        for other in [
            "n",
            "c",
            "cm",
            "cx12",
            "cm-1",
            "cm1a",
            "d300_4",
            "cm1234567890123",
        ] {
            assert_eq!(parse_attr(other), None, "{other}");
        }
    }

    #[test]
    fn a_window_covers_its_length_and_less_than_one_bucket_more() {
        for now in [0, 1, 299_999, 300_000, 1_796_632_890_000] {
            for w in Window::ALL {
                let covered = now - w.from_ms(now);
                assert!(covered >= w.len_ms(), "{w:?} at {now}: {covered}");
                assert!(covered < w.len_ms() + w.grain().width_ms());
                assert_eq!(Window::parse(w.name()), Some(w));
            }
        }
        assert_eq!(Grain::Minutes5.kept(), 13);
        assert_eq!(Grain::Hour.kept(), 25);
        assert_eq!(Grain::Day.kept(), 8);
    }

    #[test]
    fn a_change_goes_to_the_kept_buckets_of_its_time() {
        let now = 10 * DAY + 3 * HOUR + 7 * MIN;
        let all: Vec<String> = buckets_of(now - MIN, now).collect();
        assert_eq!(all.len(), 3);
        // Two hours late: past the hour's buckets, in the others.
        let late: Vec<String> = buckets_of(now - 2 * HOUR, now).collect();
        assert_eq!(
            late,
            [
                attr(Grain::Hour, now - 2 * HOUR),
                attr(Grain::Day, now - 2 * HOUR)
            ]
        );
        assert_eq!(buckets_of(now - 9 * DAY, now).count(), 0);
    }

    #[test]
    fn pruning_never_touches_what_a_write_adds_to_and_covers_the_next_ones() {
        let now = 40 * DAY + 5 * HOUR + 33 * MIN;
        let pruned = pruned_attrs(now);
        assert_eq!(pruned.len(), 24);
        for g in Grain::ALL {
            for k in 0..g.kept() {
                let kept = attr(g, g.kept_from(now) + k * g.width_ms());
                assert!(!pruned.contains(&kept));
            }
            // The bucket that just expired is removed.
            assert!(pruned.contains(&attr(g, g.kept_from(now) - g.width_ms())));
        }
    }

    #[test]
    fn counts_sum_the_buckets_inside_each_window() {
        let now = 100 * DAY + 12 * HOUR;
        let mut c = WindowCounts::default();
        for at in [now - MIN, now - 50 * MIN, now - 3 * HOUR, now - 2 * DAY] {
            for name in buckets_of(at, now) {
                assert!(c.add_attr(&name, 1, now));
            }
        }
        // Stale ones (left behind by an item not written lately) are
        // skipped, whatever their value.
        assert!(c.add_attr(&attr(Grain::Minutes5, now - 2 * HOUR), 100, now));
        assert!(c.add_attr(&attr(Grain::Day, now - 30 * DAY), 100, now));
        assert!(!c.add_attr("n", 7, now));
        assert_eq!(
            c,
            WindowCounts {
                hour: 2,
                day: 3,
                week: 4
            }
        );
        let mut twice = c;
        twice.merge(&c);
        assert_eq!(twice.get(Window::Week), 8);
    }
}
