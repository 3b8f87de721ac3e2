//! The waiting queue: FCFS (a deque; preempted requests go to the front) or priority (kept sorted by
//! `(priority, arrival)`, so a preempted request keeps its place among requests of its priority
//! instead of falling behind later arrivals, vLLM #41951).
//!
//! Admission scans it in order and may pass over requests (skip-and-continue); passed-over requests
//! are never moved, so FCFS order among them is kept by construction.

use std::collections::VecDeque;

use super::config::Policy;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    priority: i32,
    seq_no: u64,
}

#[derive(Debug)]
pub(super) struct WaitingQueue {
    policy: Policy,
    /// `(key, slot)` in admission order.
    items: VecDeque<(Key, u32)>,
}

impl WaitingQueue {
    pub fn new(policy: Policy) -> Self {
        WaitingQueue {
            policy,
            items: VecDeque::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// The slot at position `i` of the admission order.
    pub fn get(&self, i: usize) -> u32 {
        self.items[i].1
    }

    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.items.iter().map(|&(_, s)| s)
    }

    /// A new arrival.
    pub fn push_new(&mut self, slot: u32, priority: i32, seq_no: u64) {
        let key = Key { priority, seq_no };
        match self.policy {
            Policy::Fcfs => self.items.push_back((key, slot)),
            Policy::Priority => self.insert_sorted(key, slot),
        }
    }

    /// A request that just lost its row: the front under FCFS, its key's place under priority.
    pub fn push_preempted(&mut self, slot: u32, priority: i32, seq_no: u64) {
        let key = Key { priority, seq_no };
        match self.policy {
            Policy::Fcfs => self.items.push_front((key, slot)),
            Policy::Priority => self.insert_sorted(key, slot),
        }
    }

    fn insert_sorted(&mut self, key: Key, slot: u32) {
        let at = self.items.partition_point(|&(k, _)| k <= key);
        self.items.insert(at, (key, slot));
    }

    /// Removes position `i` (cheap at the front, where admission removes from).
    pub fn remove_at(&mut self, i: usize) -> u32 {
        self.items.remove(i).expect("waiting index in range").1
    }

    /// Removes `slot` wherever it is (abort); false when absent.
    pub fn remove_slot(&mut self, slot: u32) -> bool {
        match self.items.iter().position(|&(_, s)| s == slot) {
            Some(i) => {
                self.items.remove(i);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fcfs_appends_arrivals_and_prepends_preempted() {
        let mut q = WaitingQueue::new(Policy::Fcfs);
        q.push_new(1, 9, 1);
        q.push_new(2, 0, 2);
        q.push_preempted(3, 5, 0);
        assert_eq!(q.iter().collect::<Vec<_>>(), [3, 1, 2]);
        assert!(q.remove_slot(1));
        assert!(!q.remove_slot(1));
        assert_eq!(q.remove_at(0), 3);
        assert_eq!(q.iter().collect::<Vec<_>>(), [2]);
    }

    #[test]
    fn priority_orders_by_priority_then_arrival_and_preempted_keep_their_place() {
        let mut q = WaitingQueue::new(Policy::Priority);
        q.push_new(10, 2, 1);
        q.push_new(11, 0, 2);
        q.push_new(12, 1, 3);
        q.push_new(13, 1, 4);
        // Preempted request with priority 1 that arrived before 12 and 13.
        q.push_preempted(14, 1, 0);
        assert_eq!(q.iter().collect::<Vec<_>>(), [11, 14, 12, 13, 10]);
    }
}
