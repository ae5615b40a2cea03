//! Fault injection: make chosen commands fail, stall, or vanish.
//!
//! Rules are matched in the order they were added against every command the
//! controller executes; a matching rule with hits left is consumed and its
//! action applied instead of (or before) normal execution.

use std::ops::Range;
use std::sync::Mutex;
use std::time::Duration;
use tutti_driver::spec::Status;

/// What happens to a command that matches a rule.
#[derive(Clone, Debug, PartialEq)]
pub enum FaultAction {
    /// Complete the command with this status without executing it.
    Fail(Status),
    /// Execute the command normally, but only complete it after this delay.
    Delay(Duration),
    /// Execute the command but never post its completion.
    DropCompletion,
    /// Leave the command untouched for this long, then execute it (move its
    /// data) and post its completion. Unlike [`Delay`](Self::Delay), nothing
    /// reaches the media or host memory before the delay is over: this is the
    /// "late DMA" of a command the host already gave up on. A controller
    /// reset forgets the command (it never executes); deleting its SQ
    /// aborts it unexecuted (§5.6); a shutdown executes it before reporting
    /// shutdown complete.
    DelayExecution(Duration),
}

/// Which commands a rule applies to. Empty fields match anything.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FaultMatch {
    /// Submission queue id (0 = admin).
    pub qid: Option<u16>,
    pub opcode: Option<u8>,
    /// Commands whose starting LBA falls in this range.
    pub lba: Option<Range<u64>>,
    /// Skip this many matching commands before the rule fires.
    pub skip: u32,
}

#[derive(Clone, Debug)]
struct Rule {
    when: FaultMatch,
    action: FaultAction,
    /// How many more commands this rule applies to; `None` = forever.
    remaining: Option<u32>,
    skipped: u32,
}

/// The fault rules of one controller.
#[derive(Default)]
pub struct FaultInjector {
    rules: Mutex<Vec<Rule>>,
    /// How many rules there are, kept with `rules` under its lock: the controller
    /// checks every command, and with no rules that must cost a load, not a lock.
    count: std::sync::atomic::AtomicUsize,
}

impl FaultInjector {
    /// Adds a rule that fires `times` times (`None`: every match).
    pub fn inject(&self, when: FaultMatch, action: FaultAction, times: Option<u32>) {
        if let Ok(mut rules) = self.rules.lock() {
            rules.push(Rule { when, action, remaining: times, skipped: 0 });
            self.count.store(rules.len(), std::sync::atomic::Ordering::Release);
        }
    }

    /// Makes the next command matching `when` fail with `status`.
    pub fn fail_next(&self, when: FaultMatch, status: Status) {
        self.inject(when, FaultAction::Fail(status), Some(1));
    }

    /// Makes the next command matching `when` lose its completion.
    pub fn drop_next(&self, when: FaultMatch) {
        self.inject(when, FaultAction::DropCompletion, Some(1));
    }

    /// Makes the next command matching `when` execute only after `by`.
    pub fn delay_execution_next(&self, when: FaultMatch, by: Duration) {
        self.inject(when, FaultAction::DelayExecution(by), Some(1));
    }

    pub fn clear(&self) {
        if let Ok(mut rules) = self.rules.lock() {
            rules.clear();
            self.count.store(0, std::sync::atomic::Ordering::Release);
        }
    }

    /// Called by the controller for every command; returns the action to apply.
    pub fn check(&self, qid: u16, opcode: u8, slba: Option<u64>) -> Option<FaultAction> {
        // A rule added while a command is being checked applies from the next command on,
        // as it would have had the check taken the lock first.
        if self.count.load(std::sync::atomic::Ordering::Acquire) == 0 {
            return None;
        }
        let mut rules = self.rules.lock().ok()?;
        if rules.is_empty() {
            return None;
        }
        let mut fired = None;
        for (i, rule) in rules.iter_mut().enumerate() {
            let w = &rule.when;
            let matches = w.qid.is_none_or(|q| q == qid)
                && w.opcode.is_none_or(|o| o == opcode)
                && w.lba.as_ref().is_none_or(|r| slba.is_some_and(|l| r.contains(&l)));
            if !matches {
                continue;
            }
            if rule.skipped < w.skip {
                rule.skipped += 1;
                continue;
            }
            if let Some(n) = rule.remaining.as_mut() {
                *n -= 1;
            }
            fired = Some((i, rule.action.clone()));
            break;
        }
        let (i, action) = fired?;
        if rules[i].remaining == Some(0) {
            rules.remove(i);
            self.count.store(rules.len(), std::sync::atomic::Ordering::Release);
        }
        Some(action)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_match_skip_and_expire() {
        let f = FaultInjector::default();
        f.inject(
            FaultMatch { qid: Some(1), opcode: Some(2), skip: 1, ..Default::default() },
            FaultAction::Fail(Status::UNRECOVERED_READ_ERROR),
            Some(1),
        );
        assert_eq!(f.check(1, 1, Some(0)), None); // wrong opcode
        assert_eq!(f.check(2, 2, Some(0)), None); // wrong queue
        assert_eq!(f.check(1, 2, Some(0)), None); // skipped
        assert_eq!(f.check(1, 2, Some(0)), Some(FaultAction::Fail(Status::UNRECOVERED_READ_ERROR)));
        assert_eq!(f.check(1, 2, Some(0)), None); // used up
    }

    #[test]
    fn delayed_execution_fires_once_for_its_match() {
        let f = FaultInjector::default();
        let by = Duration::from_millis(5);
        f.delay_execution_next(FaultMatch { opcode: Some(1), lba: Some(8..9), ..Default::default() }, by);
        assert_eq!(f.check(1, 2, Some(8)), None); // a read
        assert_eq!(f.check(1, 1, Some(9)), None); // another LBA
        assert_eq!(f.check(1, 1, Some(8)), Some(FaultAction::DelayExecution(by)));
        assert_eq!(f.check(1, 1, Some(8)), None); // used up
    }

    #[test]
    fn lba_ranges_select_commands() {
        let f = FaultInjector::default();
        f.inject(FaultMatch { lba: Some(100..200), ..Default::default() }, FaultAction::DropCompletion, None);
        assert_eq!(f.check(1, 2, Some(99)), None);
        assert_eq!(f.check(1, 2, None), None);
        assert_eq!(f.check(1, 2, Some(150)), Some(FaultAction::DropCompletion));
        assert_eq!(f.check(3, 1, Some(199)), Some(FaultAction::DropCompletion));
        f.clear();
        assert_eq!(f.check(3, 1, Some(199)), None);
    }
}
