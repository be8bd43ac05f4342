//! Hand-offs between the runtime's thread and a thread doing its blocking
//! work, without putting a CPU to sleep for an answer that is microseconds
//! away.
//!
//! A plain ADD on the embedded store is a chain of short datastore
//! operations, each handed from the runtime's thread to the connection's
//! thread and answered back: about a dozen hand-offs, each operation 10-130
//! µs of SQLite. A thread that sleeps for each one lets its CPU go idle,
//! and waking an idle CPU is the slow part: on the virtual machines these
//! figures come from (guest halt polling off) a wake-up of the plugin's
//! threads waited 65 µs on average before it ran (`perf sched latency`),
//! and an operation's round trip took 0.14-0.17 ms. So a thread that knows
//! an answer or a next operation is coming waits for it awake, briefly
//! ([`SPIN`]), yielding its CPU at every turn, and only then sleeps:
//!
//! - the runtime's thread, before it parks, while work it handed off is in
//!   flight ([`InFlight`], [`before_park`]: the runtime's park hook);
//! - the datastore's thread, after its last operation, for the next one
//!   ([`wait_for`]).
//!
//! A waiting thread stops at the first yield that ran another thread (the
//! machine is busy: its CPU is wanted), so under load it costs a yield and
//! takes no CPU from the calls around it. BENCHMARKS.md, "The call's runtime,
//! threads and hand-offs".
//!
//! Blocking work goes to the pool through [`spawn_blocking`], which counts
//! it until it returns: at the call's end the process then knows whether
//! any is still running ([`blocking_work_running`]). When none is, the
//! pool's idle threads are left to the process's exit rather than woken,
//! joined and unmapped one by one (BENCHMARKS.md, "The call's
//! runtime, threads and hand-offs").

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long a thread stays awake for an answer or a next job: a few
/// wake-ups' worth (the answers a call waits for take 10-100 µs; waking
/// an idle vCPU took 65 µs).
pub const SPIN: Duration = Duration::from_micros(150);

/// Work handed off the runtime's thread and not yet answered.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
/// Answers given so far (bumped once the answer is on its way).
static ANSWERED: AtomicUsize = AtomicUsize::new(0);

/// One piece of work handed off, from the hand-off until its answer has
/// been sent (drop it after sending: the runtime's thread stops waiting
/// awake when it is dropped).
#[must_use = "the hand-off is answered when this is dropped"]
pub struct InFlight(());

impl InFlight {
    pub fn new() -> InFlight {
        IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
        InFlight(())
    }
}

impl Default for InFlight {
    fn default() -> Self {
        InFlight::new()
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        ANSWERED.fetch_add(1, Ordering::SeqCst);
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The runtime's park hook: with work in flight, wait awake (up to
/// [`SPIN`]) for an answer before the thread sleeps; the answer's wake-up
/// then finds it awake and the park returns at once.
pub fn before_park() {
    if IN_FLIGHT.load(Ordering::SeqCst) == 0 {
        return;
    }
    let seen = ANSWERED.load(Ordering::SeqCst);
    wait_for(|| (ANSWERED.load(Ordering::SeqCst) != seen).then_some(()));
}

/// Polls `ready` until it answers or [`SPIN`] has passed, yielding the CPU
/// between polls; stops at once when a yield gave the CPU away (another
/// thread was waiting for it: the machine is busy, and waiting awake
/// would take its time).
pub fn wait_for<T>(mut ready: impl FnMut() -> Option<T>) -> Option<T> {
    let until = Instant::now() + SPIN;
    loop {
        if let Some(t) = ready() {
            return Some(t);
        }
        for _ in 0..64 {
            std::hint::spin_loop();
        }
        let before = Instant::now();
        if before >= until {
            return None;
        }
        std::thread::yield_now();
        if before.elapsed() >= GAVE_WAY {
            return ready();
        }
    }
}

/// A yield that took this long ran another thread.
const GAVE_WAY: Duration = Duration::from_micros(20);

/// Blocking work handed to the pool and not yet returned (queued or
/// running).
static BLOCKING: AtomicUsize = AtomicUsize::new(0);

/// One piece of blocking work, counted from its hand-off until it returns
/// (or is dropped unrun, when the runtime shuts down first).
struct Blocking(());

impl Blocking {
    fn new() -> Blocking {
        BLOCKING.fetch_add(1, Ordering::SeqCst);
        Blocking(())
    }
}

impl Drop for Blocking {
    fn drop(&mut self) {
        BLOCKING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `tokio::task::spawn_blocking`, counted ([`blocking_work_running`]).
/// Every blocking hand-off of the call goes through here.
pub fn spawn_blocking<F, R>(work: F) -> tokio::task::JoinHandle<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    let counted = Blocking::new();
    tokio::task::spawn_blocking(move || {
        let _counted = counted;
        work()
    })
}

/// Whether blocking work handed off through [`spawn_blocking`] has not
/// returned yet: work a call gave up waiting for at a deadline, which its
/// runtime's end should let finish.
pub fn blocking_work_running() -> bool {
    BLOCKING.load(Ordering::SeqCst) > 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn wait_for_sees_an_answer_given_meanwhile() {
        let flag = Arc::new(AtomicBool::new(false));
        let setter = {
            let flag = Arc::clone(&flag);
            std::thread::spawn(move || flag.store(true, Ordering::SeqCst))
        };
        // (The setter may be slow to start: retry until it has run.)
        let mut seen = None;
        while seen.is_none() {
            seen = wait_for(|| flag.load(Ordering::SeqCst).then_some(7));
        }
        setter.join().unwrap();
        assert_eq!(seen, Some(7));
    }

    #[test]
    fn wait_for_gives_up_after_the_spin() {
        let started = Instant::now();
        let mut polls = 0;
        let seen: Option<()> = wait_for(|| {
            polls += 1;
            None
        });
        assert_eq!(seen, None);
        // It polled more than once, and stopped: after SPIN, or at the
        // first yield that ran another thread (a busy test machine).
        assert!(polls > 1 || started.elapsed() >= GAVE_WAY, "{polls} polls");
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn blocking_work_counts_until_it_returns() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let work = {
            let _inside = runtime.enter();
            spawn_blocking(move || released.recv())
        };
        assert!(blocking_work_running());
        release.send(()).unwrap();
        runtime.block_on(work).unwrap().unwrap();
        // (Other tests' work may run meanwhile: wait until all returned.)
        let until = Instant::now() + Duration::from_secs(10);
        while blocking_work_running() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!blocking_work_running());
    }

    #[test]
    fn an_answer_counts_when_its_hand_off_ends() {
        let before = ANSWERED.load(Ordering::SeqCst);
        let in_flight = InFlight::new();
        assert!(IN_FLIGHT.load(Ordering::SeqCst) >= 1);
        drop(in_flight);
        assert!(ANSWERED.load(Ordering::SeqCst) > before);
    }
}
