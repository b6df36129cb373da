//! Requests held by dispatch pacing ([`switchyard_core::pacing`]), in line per worker set.
//!
//! A change on a worker (a first token, an end) can only make that worker take a prompt it
//! refused before; every other worker looks to a held request as it did when it last planned.
//! So a change on worker `w` starts a *sweep* of its set's line for `w`, oldest first: each
//! request in turn plans again from fresh state and passes the sweep to the next younger one,
//! until one is held for `w` itself. Behind it, `w` takes no long prompt either (it refused
//! this one), and nothing else changed for the rest. Hence:
//!
//! - held requests are offered a freed worker oldest first, one after another (never a herd
//!   planning at once), as the virtual-time calibrator offers them after every engine step;
//! - a change costs the plans of the requests up to the first one held for the changed worker
//!   (and of those it sends), not one plan per held request per change;
//! - only the oldest request held for a worker waits on that worker's pacing gap
//!   ([`HoldPlace::hold_for`] says whether it is the one); the others wait for a sweep, with a
//!   slower recheck as a safety net (a worker that left, a short prompt the sweep stopped
//!   before), so prompts held for one worker reach it oldest first;
//! - a place leaves its line when it is dropped (a request sent, failed or cancelled); a sweep
//!   that reached it and that it had not yet passed on goes on to the next one.
//!
//! Wake-ups are [`Notify`] permits and sweeps wait in the request's entry: one that arrives
//! while the request is planning ends its next wait at once, so none is lost between a plan
//! and the wait after it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rustc_hash::FxHashMap;
use switchyard_core::Name;
use tokio::sync::Notify;

/// Every worker set's line of held requests.
#[derive(Default)]
pub struct HoldLines {
    inner: Mutex<Lines>,
}

#[derive(Default)]
struct Lines {
    /// Arrival order of places: a place's age is taken when it is created.
    next_age: u64,
    /// Worker set → age → the held request.
    sets: FxHashMap<Name, BTreeMap<u64, Held>>,
}

struct Held {
    /// The worker it was last held for.
    worker: Name,
    wake: Arc<Notify>,
    /// Sweeps (by changed worker) that reached it and that it has not passed on yet.
    sweeps: Vec<Name>,
}

impl Lines {
    /// Hands a sweep for `worker` to the oldest request in `set` younger than `after` (the
    /// oldest of all without it).
    fn sweep(&mut self, set: &str, worker: &Name, after: Option<u64>) {
        let Some(line) = self.sets.get_mut(set) else { return };
        let next = match after {
            None => line.iter_mut().next(),
            Some(age) => line.range_mut(age + 1..).next(),
        };
        if let Some((_, held)) = next {
            if !held.sweeps.contains(worker) {
                held.sweeps.push(worker.clone());
            }
            held.wake.notify_one();
        }
    }

    /// Removes the request of `age` from `set`'s line and passes on the sweeps that reached it.
    fn remove(&mut self, set: &Name, age: u64) {
        let Some(line) = self.sets.get_mut(set) else { return };
        let sweeps = line.remove(&age).map(|h| h.sweeps).unwrap_or_default();
        if line.is_empty() {
            self.sets.remove(set);
        }
        for worker in &sweeps {
            self.sweep(set, worker, Some(age));
        }
    }
}

impl HoldLines {
    fn lock(&self) -> MutexGuard<'_, Lines> {
        // Every update under the lock is a few inserts and removes that leave the lines
        // consistent, so a lock poisoned by a panic elsewhere is still usable.
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A place for one request, older than every place created after it; it is in no line
    /// until [`HoldPlace::hold_for`].
    pub fn place(&self) -> HoldPlace<'_> {
        let mut lines = self.lock();
        lines.next_age += 1;
        HoldPlace { lines: self, age: lines.next_age, held_in: None, wake: Arc::new(Notify::new()) }
    }

    /// A worker's ledger changed (a first token, an end): sweep its set's line for it.
    pub fn changed(&self, set: &str, worker: &Name) {
        self.lock().sweep(set, worker, None);
    }

    /// Requests held now for each worker of `sets`, in one pass under the lock.
    pub fn held_for(&self, sets: &[String]) -> FxHashMap<(Name, Name), u32> {
        let lines = self.lock();
        let mut out: FxHashMap<(Name, Name), u32> = FxHashMap::default();
        for set in sets {
            let Some((name, line)) = lines.sets.get_key_value(set.as_str()) else { continue };
            for held in line.values() {
                *out.entry((name.clone(), held.worker.clone())).or_default() += 1;
            }
        }
        out
    }

    /// Requests held now, per worker set (sets with none are left out).
    pub fn held(&self) -> Vec<(Name, usize)> {
        self.lock().sets.iter().map(|(s, l)| (s.clone(), l.len())).collect()
    }
}

/// One request's place in its worker set's line, while it is held.
pub struct HoldPlace<'a> {
    lines: &'a HoldLines,
    age: u64,
    /// The (set, worker) it is held for, once held.
    held_in: Option<(Name, Name)>,
    wake: Arc<Notify>,
}

impl HoldPlace<'_> {
    /// Holds the request for `worker` of `set` (joining that set's line, or moving within it,
    /// at its first age). `sweeps` are the ones that woke it ([`HoldPlace::wait`]): each goes
    /// on to the next younger request unless it was for `worker`, which just refused this one.
    /// Returns whether it is now the oldest request held for that worker, the one that waits
    /// on the worker's pacing gap.
    pub fn hold_for(&mut self, set: &Name, worker: &Name, sweeps: &[Name]) -> bool {
        let mut lines = self.lines.lock();
        if let Some((old_set, _)) = &self.held_in
            && old_set != set
        {
            lines.remove(old_set, self.age);
        }
        let line = lines.sets.entry(set.clone()).or_default();
        // Sweeps that reached it since it was woken stay, to be taken by its next wait.
        let pending = line.remove(&self.age).map(|h| h.sweeps).unwrap_or_default();
        line.insert(self.age, Held { worker: worker.clone(), wake: self.wake.clone(), sweeps: pending });
        let oldest = line.iter().find(|(_, h)| h.worker == *worker).is_some_and(|(age, _)| *age == self.age);
        for swept in sweeps.iter().filter(|w| *w != worker) {
            lines.sweep(set, swept, Some(self.age));
        }
        self.held_in = Some((set.clone(), worker.clone()));
        oldest
    }

    /// Waits for a sweep (or one that came since the last wait) or for `recheck`; returns the
    /// sweeps that reached it, to hand to [`HoldPlace::hold_for`] or [`HoldPlace::leave`].
    pub async fn wait(&self, recheck: Duration) -> Vec<Name> {
        tokio::select! {
            () = self.wake.notified() => {}
            () = tokio::time::sleep(recheck) => {}
        }
        let Some((set, _)) = &self.held_in else { return Vec::new() };
        let mut lines = self.lines.lock();
        lines
            .sets
            .get_mut(set)
            .and_then(|l| l.get_mut(&self.age))
            .map(|h| std::mem::take(&mut h.sweeps))
            .unwrap_or_default()
    }

    /// The request is sent: it leaves its line, and the sweeps that woke it go on to the
    /// requests behind it.
    pub fn leave(mut self, sweeps: &[Name]) {
        let Some((set, _)) = self.held_in.take() else { return };
        let mut lines = self.lines.lock();
        lines.remove(&set, self.age);
        for worker in sweeps {
            lines.sweep(&set, worker, Some(self.age));
        }
    }
}

impl Drop for HoldPlace<'_> {
    fn drop(&mut self) {
        if let Some((set, _)) = self.held_in.take() {
            self.lines.lock().remove(&set, self.age);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> Name {
        Name::from(s)
    }

    /// The sweeps that woke the place, or `None` if nothing woke it within 20 ms.
    async fn woken(place: &HoldPlace<'_>) -> Option<Vec<Name>> {
        tokio::time::timeout(Duration::from_millis(20), place.wake.notified()).await.ok()?;
        let (set, _) = place.held_in.as_ref()?;
        let mut lines = place.lines.lock();
        Some(std::mem::take(&mut lines.sets.get_mut(set)?.get_mut(&place.age)?.sweeps))
    }

    #[tokio::test]
    async fn a_sweep_visits_the_line_oldest_first_until_one_is_held_for_the_changed_worker() {
        let lines = HoldLines::default();
        let (set, a, b) = (name("s"), name("a"), name("b"));
        let mut places: Vec<_> = (0..4).map(|_| lines.place()).collect();
        // Held for: b, a, b, a.
        for (i, p) in places.iter_mut().enumerate() {
            p.hold_for(&set, if i % 2 == 0 { &b } else { &a }, &[]);
        }
        lines.changed("s", &a);
        let sweeps = woken(&places[0]).await.expect("the oldest is offered the change first");
        assert_eq!(sweeps, vec![a.clone()]);
        assert!(woken(&places[1]).await.is_none(), "one at a time");
        // Still held, for b: a's change goes on to the next.
        places[0].hold_for(&set, &b, &sweeps);
        let sweeps = woken(&places[1]).await.expect("passed on");
        // Held for a itself: a takes no more, the sweep stops.
        places[1].hold_for(&set, &a, &sweeps);
        assert!(woken(&places[2]).await.is_none() && woken(&places[3]).await.is_none());
        lines.changed("other", &a);
        assert!(places.iter().all(|p| p.wake_is_idle()));
    }

    impl HoldPlace<'_> {
        fn wake_is_idle(&self) -> bool {
            self.lines.lock().sets.values().all(|l| l.get(&self.age).is_none_or(|h| h.sweeps.is_empty()))
        }
    }

    #[tokio::test]
    async fn a_sent_or_dropped_request_passes_its_sweeps_on() {
        let lines = HoldLines::default();
        let (set, a) = (name("s"), name("a"));
        let mut places: Vec<_> = (0..3).map(|_| lines.place()).collect();
        for p in &mut places {
            p.hold_for(&set, &a, &[]);
        }
        let [oldest, next, last] = <[_; 3]>::try_from(places).ok().expect("three places");
        lines.changed("s", &a);
        let sweeps = woken(&oldest).await.expect("the oldest is swept first");
        oldest.leave(&sweeps);
        assert_eq!(woken(&next).await, Some(vec![a.clone()]));
        assert_eq!(lines.held(), vec![(set.clone(), 2)]);
        // A sweep reaches `next` while it plans; it is cancelled before its next wait: the
        // sweep goes on to `last` rather than stopping with it.
        lines.changed("s", &a);
        drop(next);
        assert_eq!(woken(&last).await, Some(vec![a]));
        assert_eq!(lines.held(), vec![(set, 1)]);
        drop(last);
        assert!(lines.held().is_empty());
    }

    #[tokio::test]
    async fn a_place_keeps_its_age_when_held_for_another_worker_or_set() {
        let lines = HoldLines::default();
        let (s, t, a, b) = (name("s"), name("t"), name("a"), name("b"));
        let mut older = lines.place();
        let mut younger = lines.place();
        assert!(younger.hold_for(&s, &a, &[]));
        assert!(older.hold_for(&s, &b, &[]));
        // Moving to the younger one's worker puts it ahead of it: ages, not joins, order a line.
        assert!(older.hold_for(&s, &a, &[]));
        assert!(!younger.hold_for(&s, &a, &[]));
        assert!(older.hold_for(&t, &a, &[]), "alone in the other set's line");
        assert!(younger.hold_for(&s, &a, &[]), "the older one left this set's line");
        let mut held = lines.held();
        held.sort();
        assert_eq!(held, vec![(s, 1), (t, 1)]);
    }

    #[tokio::test]
    async fn a_sweep_during_planning_ends_the_next_wait_at_once() {
        let lines = HoldLines::default();
        let (s, a) = (name("s"), name("a"));
        let mut place = lines.place();
        place.hold_for(&s, &a, &[]);
        lines.changed("s", &a);
        // Planning again, it is held for the same worker: the sweep it had not yet taken stays.
        place.hold_for(&s, &a, &[]);
        let started = std::time::Instant::now();
        assert_eq!(place.wait(Duration::from_secs(30)).await, vec![a]);
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
