//! What a long operation a person runs is doing and how far it is
//! (`calico ipam check|show`, `calico-ipam -upgrade`, `calico install
//! --watch`), always on stderr: stdout carries the commands' output (tables,
//! JSON, reports), which stays as it is.
//!
//! On a terminal, one status line rewritten in place (`\r`, erased with
//! `ESC[K`, cut to the terminal's width) at most every [`REDRAW`], and
//! erased at the end, so that nothing of it is left. Elsewhere (a log, CI),
//! plain lines: one as each phase starts, one every [`Progress::every`]
//! (5 s by default) of a long phase with its count, and one at the end with
//! the time taken; written to stderr with the command's prefix, or through
//! the log ([`Progress::logged`], for commands that log).
//!
//! A tick is cheap: the clock is looked at only every so many ticks (the
//! stride doubles while ticks come fast and halves when they come slowly),
//! so a loop over a million items pays a lock and a compare per item.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The shortest time between two drawings of the status line.
pub const REDRAW: Duration = Duration::from_millis(100);
/// The default time between two plain lines of one phase.
pub const PLAIN_EVERY: Duration = Duration::from_secs(5);
/// The largest number of ticks between two looks at the clock.
const MAX_STRIDE: u64 = 4096;

/// Where the lines go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// A terminal: the status line.
    Terminal,
    /// Plain lines, written with the prefix.
    Lines,
    /// Plain lines, through `tracing` (info).
    Log,
    /// Nothing.
    Silent,
}

struct State {
    out: Box<dyn Write + Send>,
    mode: Mode,
    prefix: String,
    width: usize,
    every: Duration,
    started: Instant,
    phase: String,
    phase_started: Instant,
    total: Option<u64>,
    done: u64,
    /// The tick at which the clock is looked at next, and the stride.
    next_look: u64,
    stride: u64,
    last_look: Instant,
    /// When the status line was drawn, or the last plain line written.
    last_shown: Instant,
    /// The status line is on the terminal.
    drawn: bool,
    /// Something was shown (a phase): the end is worth a line.
    said: bool,
    finished: bool,
}

/// A progress reporter (see the module's documentation). Shared by
/// reference: its methods take `&self`.
pub struct Progress {
    state: Mutex<State>,
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress").finish_non_exhaustive()
    }
}

/// The terminal's width on stderr (80 when it cannot be told).
fn stderr_width() -> usize {
    // SAFETY: TIOCGWINSZ fills the winsize it is given; a failure leaves it
    // zeroed.
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::ioctl(libc::STDERR_FILENO, libc::TIOCGWINSZ, &mut size) } == 0;
    if ok && size.ws_col > 0 {
        usize::from(size.ws_col)
    } else {
        80
    }
}

/// `1.2 s`, `42 s`, `3m05s`, `2h03m`.
pub fn duration_text(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, s % 3600 / 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else if s >= 10 {
        format!("{s} s")
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

impl Progress {
    fn with(out: Box<dyn Write + Send>, mode: Mode, prefix: &str, width: usize) -> Progress {
        let now = Instant::now();
        Progress {
            state: Mutex::new(State {
                out,
                mode,
                prefix: prefix.to_string(),
                width: width.max(20),
                every: PLAIN_EVERY,
                started: now,
                phase: String::new(),
                phase_started: now,
                total: None,
                done: 0,
                next_look: 1,
                stride: 1,
                last_look: now,
                last_shown: now,
                drawn: false,
                said: false,
                finished: false,
            }),
        }
    }

    /// On stderr: the status line when it is a terminal, else plain lines
    /// starting `PREFIX: `.
    pub fn stderr(prefix: &str) -> Progress {
        if std::io::stderr().is_terminal() {
            Progress::with(
                Box::new(std::io::stderr()),
                Mode::Terminal,
                prefix,
                stderr_width(),
            )
        } else {
            Progress::with(Box::new(std::io::stderr()), Mode::Lines, prefix, 80)
        }
    }

    /// As [`Progress::stderr`], but the plain lines are logged (info,
    /// without the prefix).
    pub fn logged(prefix: &str) -> Progress {
        let p = Progress::stderr(prefix);
        if let Ok(mut s) = p.state.lock()
            && s.mode == Mode::Lines
        {
            s.mode = Mode::Log;
        }
        p
    }

    /// On `out`, as a terminal (`terminal`) or not, `width` columns wide.
    pub fn to(out: Box<dyn Write + Send>, terminal: bool, prefix: &str, width: usize) -> Progress {
        let mode = if terminal {
            Mode::Terminal
        } else {
            Mode::Lines
        };
        Progress::with(out, mode, prefix, width)
    }

    /// Says nothing.
    pub fn silent() -> Progress {
        Progress::with(Box::new(std::io::sink()), Mode::Silent, "", 80)
    }

    /// The time between two plain lines of one phase.
    pub fn every(self, every: Duration) -> Progress {
        if let Ok(mut s) = self.state.lock() {
            s.every = every;
        }
        self
    }

    /// A status line is drawn (a terminal), not plain lines.
    pub fn on_terminal(&self) -> bool {
        self.state.lock().is_ok_and(|s| s.mode == Mode::Terminal)
    }

    /// A new phase, `what` (`checking blocks`), of `total` items when known
    /// (counted with [`Progress::tick`]).
    pub fn phase(&self, what: &str, total: Option<u64>) {
        let Ok(mut s) = self.state.lock() else { return };
        let now = Instant::now();
        s.phase = what.to_string();
        s.phase_started = now;
        s.total = total;
        s.done = 0;
        s.next_look = 1;
        s.stride = 1;
        s.last_look = now;
        s.said = true;
        let line = match total {
            Some(n) if s.mode == Mode::Terminal => format!("{what}... 0/{n}"),
            Some(n) => format!("{what} ({n})..."),
            None => format!("{what}..."),
        };
        s.show(&line, now);
    }

    /// The phase's text is now `what` (`watching: next renewal in 3m05s`):
    /// drawn at most every [`REDRAW`] on a terminal, written at most every
    /// [`Progress::every`] elsewhere.
    pub fn update(&self, what: &str) {
        let Ok(mut s) = self.state.lock() else { return };
        s.phase.clear();
        s.phase.push_str(what);
        if s.mode == Mode::Silent {
            return;
        }
        let now = Instant::now();
        let due = match s.mode {
            Mode::Terminal => REDRAW,
            _ => s.every,
        };
        if now.duration_since(s.last_shown) >= due {
            s.said = true;
            s.show(what, now);
        }
    }

    /// `done` items of the phase are done.
    pub fn tick(&self, done: u64) {
        let Ok(mut s) = self.state.lock() else { return };
        s.done = done;
        if done < s.next_look || s.mode == Mode::Silent {
            return;
        }
        let now = Instant::now();
        // Ticks that come faster than every 10 ms are looked at less often.
        s.stride = if now.duration_since(s.last_look) < Duration::from_millis(10) {
            (s.stride * 2).min(MAX_STRIDE)
        } else {
            (s.stride / 2).max(1)
        };
        s.next_look = done + s.stride;
        s.last_look = now;
        let due = match s.mode {
            Mode::Terminal => REDRAW,
            _ => s.every,
        };
        if now.duration_since(s.last_shown) < due {
            return;
        }
        let count = match s.total {
            Some(n) => format!("{done}/{n}"),
            None => done.to_string(),
        };
        let line = if s.mode == Mode::Terminal {
            format!("{}... {count}", s.phase)
        } else {
            let took = duration_text(now.duration_since(s.phase_started));
            format!("{}: {count} ({took})", s.phase)
        };
        s.show(&line, now);
    }

    /// A line that stays (`line` as it is, without the prefix): on a
    /// terminal, written above the status line, which is drawn again.
    pub fn note(&self, line: &str) {
        let Ok(mut s) = self.state.lock() else { return };
        match s.mode {
            Mode::Silent => {}
            Mode::Log => tracing::info!("{line}"),
            Mode::Lines => {
                let _ = writeln!(s.out, "{line}");
            }
            Mode::Terminal => {
                let was = s.drawn;
                s.erase();
                let _ = writeln!(s.out, "{line}");
                if was {
                    let status = s.status_now();
                    s.draw(&status);
                }
                let _ = s.out.flush();
            }
        }
    }

    /// Erases the status line (before something else is written to the
    /// terminal); the next phase or tick draws it again.
    pub fn clear(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.erase();
            let _ = s.out.flush();
        }
    }

    /// The end: the status line erased; elsewhere, `done in <time>` (when a
    /// phase was shown). A failure just drops the reporter: its message is
    /// the last line.
    pub fn finish(&self) {
        let Ok(mut s) = self.state.lock() else { return };
        if s.finished {
            return;
        }
        s.finished = true;
        if !s.said {
            return;
        }
        if s.mode == Mode::Terminal {
            s.erase();
            let _ = s.out.flush();
        } else {
            let line = format!("done in {}", duration_text(s.started.elapsed()));
            s.show(&line, Instant::now());
        }
    }
}

impl State {
    /// The status line as it is now (phase and count).
    fn status_now(&self) -> String {
        match self.total {
            Some(n) => format!("{}... {}/{n}", self.phase, self.done),
            None if self.done > 0 => format!("{}... {}", self.phase, self.done),
            None => format!("{}...", self.phase),
        }
    }

    /// `line` (without the prefix) as the status line or a plain line.
    fn show(&mut self, line: &str, now: Instant) {
        self.last_shown = now;
        match self.mode {
            Mode::Silent => {}
            Mode::Log => tracing::info!("{line}"),
            Mode::Lines => {
                let _ = writeln!(self.out, "{}: {line}", self.prefix);
            }
            Mode::Terminal => {
                self.draw(line);
                let _ = self.out.flush();
            }
        }
    }

    fn draw(&mut self, line: &str) {
        let full = format!("{}: {line}", self.prefix);
        let cut: String = full.chars().take(self.width - 1).collect();
        let _ = write!(self.out, "\r{cut}\x1b[K");
        self.drawn = true;
    }

    fn erase(&mut self) {
        if self.drawn {
            let _ = write!(self.out, "\r\x1b[K");
            self.drawn = false;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Ok(mut s) = self.state.lock()
            && s.drawn
        {
            s.erase();
            let _ = s.out.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// A writer whose bytes the test reads.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Shared {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    #[test]
    fn on_a_terminal_one_line_is_rewritten_and_erased_at_the_end() {
        let out = Shared::default();
        let p = Progress::to(Box::new(out.clone()), true, "calico ipam check", 80);
        assert!(p.on_terminal());
        p.phase("reading the IPAM objects", None);
        p.phase("checking blocks", Some(500));
        // Ticks within REDRAW of the last drawing are not drawn.
        p.tick(1);
        assert_eq!(
            out.text(),
            "\rcalico ipam check: reading the IPAM objects...\x1b[K\
             \rcalico ipam check: checking blocks... 0/500\x1b[K"
        );
        std::thread::sleep(REDRAW + Duration::from_millis(20));
        // (The clock is looked at every so many ticks: 1, then 3, ...)
        p.tick(10);
        assert!(
            out.text()
                .ends_with("\rcalico ipam check: checking blocks... 10/500\x1b[K"),
            "{:?}",
            out.text()
        );
        // A line that stays goes above the status line, drawn again.
        p.note("kept");
        assert!(
            out.text()
                .ends_with("\r\x1b[Kkept\n\rcalico ipam check: checking blocks... 10/500\x1b[K"),
            "{:?}",
            out.text()
        );
        p.finish();
        let text = out.text();
        assert!(text.ends_with("10/500\x1b[K\r\x1b[K"), "{text:?}");
        // Nothing but the status line: no newline besides the note's.
        assert_eq!(text.matches('\n').count(), 1, "{text:?}");
        drop(p);
        assert_eq!(out.text(), text, "finished: nothing more");
    }

    #[test]
    fn the_status_line_is_cut_to_the_width_and_erased_when_dropped() {
        let out = Shared::default();
        let p = Progress::to(Box::new(out.clone()), true, "x", 20);
        p.phase("a phase with a long name", None);
        assert_eq!(out.text(), "\rx: a phase with a l\x1b[K");
        p.clear();
        assert!(out.text().ends_with("\r\x1b[K"));
        p.clear(); // nothing drawn: nothing erased
        p.phase("b", None);
        drop(p);
        assert!(
            out.text().ends_with("\rx: b...\x1b[K\r\x1b[K"),
            "{:?}",
            out.text()
        );
    }

    #[test]
    fn elsewhere_plain_lines_per_phase_and_every_so_often() {
        let out = Shared::default();
        let p = Progress::to(Box::new(out.clone()), false, "calico ipam show", 80)
            .every(Duration::from_millis(50));
        assert!(!p.on_terminal());
        p.phase("reading the IPAM objects", None);
        p.phase("summing up blocks", Some(3));
        p.tick(1);
        std::thread::sleep(Duration::from_millis(60));
        p.tick(3);
        p.note("kept");
        p.update("no line: too soon");
        std::thread::sleep(Duration::from_millis(60));
        p.update("updated");
        p.finish();
        p.finish();
        let text = out.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "calico ipam show: reading the IPAM objects...");
        assert_eq!(lines[1], "calico ipam show: summing up blocks (3)...");
        assert!(
            lines[2].starts_with("calico ipam show: summing up blocks: 3/3 ("),
            "{text}"
        );
        assert_eq!(lines[3], "kept");
        assert_eq!(lines[4], "calico ipam show: updated");
        assert!(lines[5].starts_with("calico ipam show: done in "), "{text}");
        assert_eq!(lines.len(), 6, "{text}");
        assert!(!text.contains('\r') && !text.contains('\x1b'), "{text:?}");
    }

    #[test]
    fn a_million_ticks_look_at_the_clock_rarely() {
        let out = Shared::default();
        let p = Progress::to(Box::new(out.clone()), true, "x", 80);
        p.phase("p", Some(1_000_000));
        let t = Instant::now();
        for i in 1..=1_000_000 {
            p.tick(i);
        }
        // (An unoptimised test build: generous.)
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert!(p.state.lock().unwrap().stride > 1);
    }

    #[test]
    fn silent_says_nothing() {
        let p = Progress::silent();
        p.phase("p", Some(2));
        p.tick(2);
        p.note("n");
        p.finish();
    }

    #[test]
    fn durations() {
        assert_eq!(duration_text(Duration::from_millis(1234)), "1.2 s");
        assert_eq!(duration_text(Duration::from_secs(42)), "42 s");
        assert_eq!(duration_text(Duration::from_secs(185)), "3m05s");
        assert_eq!(duration_text(Duration::from_secs(7380)), "2h03m");
    }
}
