//! One group's block pool: ref counts plus an intrusive doubly-linked free queue that is also the
//! LRU eviction order.
//!
//! The queue links live in two flat `u32` arrays indexed by block id, with one sentinel slot at
//! index `capacity` (its `next` is the head, its `prev` the tail), so pop-front, remove-from-middle,
//! append and prepend are all O(1) without allocation. A block is in the queue iff its ref count is
//! 0 (block 0, the reserved null block, is never in it).

use super::BlockId;

const NOT_LINKED: u32 = u32::MAX;

/// Intrusive doubly-linked queue over ids `0..capacity` (vLLM's `FreeKVCacheBlockQueue`).
#[derive(Debug, Clone)]
pub(crate) struct FreeQueue {
    prev: Vec<u32>,
    next: Vec<u32>,
    len: u32,
}

impl FreeQueue {
    /// An empty queue able to hold ids `0..capacity`.
    pub fn new(capacity: u32) -> Self {
        let n = capacity as usize;
        let mut q = FreeQueue {
            prev: vec![NOT_LINKED; n + 1],
            next: vec![NOT_LINKED; n + 1],
            len: 0,
        };
        q.prev[n] = capacity;
        q.next[n] = capacity;
        q
    }

    fn sentinel(&self) -> u32 {
        (self.prev.len() - 1) as u32
    }

    pub fn len(&self) -> u32 {
        self.len
    }

    pub fn contains(&self, id: BlockId) -> bool {
        self.prev[id as usize] != NOT_LINKED
    }

    fn link_after(&mut self, at: u32, id: BlockId) {
        debug_assert!(
            !self.contains(id),
            "block {id} is already in the free queue"
        );
        let nxt = self.next[at as usize];
        self.prev[id as usize] = at;
        self.next[id as usize] = nxt;
        self.next[at as usize] = id;
        self.prev[nxt as usize] = id;
        self.len += 1;
    }

    /// Appends at the tail (evicted last).
    pub fn push_back(&mut self, id: BlockId) {
        let tail = self.prev[self.sentinel() as usize];
        self.link_after(tail, id);
    }

    /// Prepends at the head (reused first).
    pub fn push_front(&mut self, id: BlockId) {
        self.link_after(self.sentinel(), id);
    }

    /// Removes `id` from wherever it is (O(1)).
    pub fn remove(&mut self, id: BlockId) {
        debug_assert!(self.contains(id), "block {id} is not in the free queue");
        let (p, n) = (self.prev[id as usize], self.next[id as usize]);
        self.next[p as usize] = n;
        self.prev[n as usize] = p;
        self.prev[id as usize] = NOT_LINKED;
        self.next[id as usize] = NOT_LINKED;
        self.len -= 1;
    }

    /// Removes and returns the head, `None` when empty.
    pub fn pop_front(&mut self) -> Option<BlockId> {
        let head = self.next[self.sentinel() as usize];
        if head == self.sentinel() {
            return None;
        }
        self.remove(head);
        Some(head)
    }

    /// The head, without removing it.
    #[cfg(test)]
    pub fn front(&self) -> Option<BlockId> {
        let head = self.next[self.sentinel() as usize];
        (head != self.sentinel()).then_some(head)
    }

    /// Ids head to tail.
    pub fn iter(&self) -> impl Iterator<Item = BlockId> + '_ {
        let s = self.sentinel();
        let mut cur = self.next[s as usize];
        std::iter::from_fn(move || {
            if cur == s {
                return None;
            }
            let id = cur;
            cur = self.next[cur as usize];
            Some(id)
        })
    }

    /// Checks that forward and backward links agree and `len` matches.
    pub fn check(&self) -> Result<(), String> {
        let s = self.sentinel();
        let mut count = 0u32;
        let mut cur = s;
        loop {
            let n = self.next[cur as usize];
            if n == NOT_LINKED || self.prev[n as usize] != cur {
                return Err(format!("free queue: broken link after {cur}"));
            }
            if n == s {
                break;
            }
            count += 1;
            if count > s {
                return Err("free queue: cycle".into());
            }
            cur = n;
        }
        if count != self.len {
            return Err(format!("free queue: len {} but {count} linked", self.len));
        }
        Ok(())
    }
}

/// A group's blocks: ref counts and the free queue (LRU order, head evicted first).
#[derive(Debug, Clone)]
pub(crate) struct BlockPool {
    ref_cnt: Vec<u32>,
    free: FreeQueue,
}

impl BlockPool {
    /// `num_blocks` blocks, block 0 reserved; blocks `1..num_blocks` start free in id order.
    pub fn new(num_blocks: u32) -> Self {
        let mut free = FreeQueue::new(num_blocks);
        for b in 1..num_blocks {
            free.push_back(b);
        }
        BlockPool {
            ref_cnt: vec![0; num_blocks as usize],
            free,
        }
    }

    /// Blocks including the reserved block 0.
    pub fn num_blocks(&self) -> u32 {
        self.ref_cnt.len() as u32
    }

    pub fn num_free(&self) -> u32 {
        self.free.len()
    }

    pub fn ref_count(&self, b: BlockId) -> u32 {
        self.ref_cnt[b as usize]
    }

    pub fn is_free(&self, b: BlockId) -> bool {
        self.free.contains(b)
    }

    /// Takes the LRU head (the caller evicts its cached content) with ref count 1.
    pub fn take_front(&mut self) -> Option<BlockId> {
        let b = self.free.pop_front()?;
        debug_assert_eq!(self.ref_cnt[b as usize], 0);
        self.ref_cnt[b as usize] = 1;
        Some(b)
    }

    /// Adds a reference; a free block leaves the free queue (lazy LRU removal). Returns whether it
    /// was free.
    pub fn touch(&mut self, b: BlockId) -> bool {
        debug_assert_ne!(b, 0, "the null block is never referenced");
        let was_free = self.ref_cnt[b as usize] == 0;
        if was_free {
            self.free.remove(b);
        }
        self.ref_cnt[b as usize] += 1;
        was_free
    }

    /// Drops a reference; returns true when it reached 0 (the caller then queues the block with
    /// [`BlockPool::push_free_back`] or [`BlockPool::push_free_front`]).
    pub fn unref(&mut self, b: BlockId) -> bool {
        let r = &mut self.ref_cnt[b as usize];
        assert!(*r > 0 && b != 0, "double free of block {b}");
        *r -= 1;
        *r == 0
    }

    pub fn push_free_back(&mut self, b: BlockId) {
        debug_assert_eq!(self.ref_cnt[b as usize], 0);
        self.free.push_back(b);
    }

    pub fn push_free_front(&mut self, b: BlockId) {
        debug_assert_eq!(self.ref_cnt[b as usize], 0);
        self.free.push_front(b);
    }

    /// Moves a free block to the head (reused first).
    pub fn move_to_front(&mut self, b: BlockId) {
        self.free.remove(b);
        self.free.push_front(b);
    }

    /// Free block ids, head (evicted first) to tail.
    pub fn free_ids(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.free.iter()
    }

    pub fn any_referenced(&self) -> bool {
        self.ref_cnt.iter().any(|&r| r > 0)
    }

    pub fn queue(&self) -> &FreeQueue {
        &self.free
    }
}

#[cfg(test)]
mod tests {
    //! scheduler.md §10.1 (FQ-1..6), on the raw queue (ids 0..n, no reserved block: the reservation
    //! of block 0 is the pool's business and is tested there).
    use super::*;

    fn queue_of(ids: &[u32], cap: u32) -> FreeQueue {
        let mut q = FreeQueue::new(cap);
        for &i in ids {
            q.push_back(i);
        }
        q
    }

    fn ids(q: &FreeQueue) -> Vec<u32> {
        q.iter().collect()
    }

    fn popleft_n(q: &mut FreeQueue, n: usize) -> Vec<u32> {
        (0..n).map(|_| q.pop_front().unwrap()).collect()
    }

    #[test]
    fn free_queue_pops_removes_and_appends_in_o1() {
        // FQ-1
        let mut q = queue_of(&[0, 1, 2, 3, 4], 5);
        assert_eq!(q.len(), 5);
        assert_eq!(q.front(), Some(0));
        assert_eq!(q.iter().last(), Some(4));
        assert_eq!(q.pop_front(), Some(0));
        assert_eq!(q.len(), 4);
        q.remove(2);
        assert_eq!(q.len(), 3);
        assert_eq!(ids(&q), vec![1, 3, 4]);
        q.push_back(2);
        assert_eq!(ids(&q), vec![1, 3, 4, 2]);
        assert_eq!(popleft_n(&mut q, 4), vec![1, 3, 4, 2]);
        assert_eq!(q.len(), 0);
        assert_eq!(q.pop_front(), None, "no free blocks available");
        q.check().unwrap();
    }

    #[test]
    fn free_queue_appends_batches_in_order() {
        // FQ-2
        let mut q = FreeQueue::new(6);
        q.push_back(0);
        for b in [4, 5] {
            q.push_back(b);
        }
        for b in [1, 2, 3] {
            q.push_back(b);
        }
        assert_eq!(ids(&q), vec![0, 4, 5, 1, 2, 3]);
        q.check().unwrap();
    }

    #[test]
    fn free_queue_prepends_batches_keeping_their_order() {
        // FQ-3: prepend_n([b4,b5]) then prepend_n([b1,b2]) == push_front in reverse order.
        let mut q = queue_of(&[0], 6);
        for b in [4, 5].into_iter().rev() {
            q.push_front(b);
        }
        assert_eq!(ids(&q), vec![4, 5, 0]);
        for b in [1, 2].into_iter().rev() {
            q.push_front(b);
        }
        assert_eq!(ids(&q), vec![1, 2, 4, 5, 0]);
        assert_eq!(popleft_n(&mut q, 5), vec![1, 2, 4, 5, 0]);
    }

    #[test]
    fn free_queue_popleft_n_takes_from_the_head() {
        // FQ-4
        let mut q = queue_of(&[1, 3, 5, 4, 0, 2], 6);
        assert_eq!(popleft_n(&mut q, 0), Vec::<u32>::new());
        assert_eq!(popleft_n(&mut q, 1), vec![1]);
        assert_eq!(popleft_n(&mut q, 2), vec![3, 5]);
        assert_eq!(popleft_n(&mut q, 3), vec![4, 0, 2]);
        for b in 0..6 {
            assert!(!q.contains(b), "popped blocks have cleared links");
        }
    }

    #[test]
    fn free_queue_drain_and_refill_keeps_order() {
        // FQ-5 / FQ-6
        for n in [1u32, 2, 16] {
            let order: Vec<u32> = (0..n).rev().collect();
            let mut q = queue_of(&order, n);
            let drained = popleft_n(&mut q, n as usize);
            assert_eq!(drained, order);
            for &b in &drained {
                q.push_back(b);
            }
            assert_eq!(ids(&q), order);
            assert_eq!(popleft_n(&mut q, n as usize), order);
            q.check().unwrap();
        }
    }

    #[test]
    fn pool_reserves_block_zero_and_starts_in_id_order() {
        let p = BlockPool::new(5);
        assert_eq!(p.num_free(), 4);
        assert_eq!(p.free_ids().collect::<Vec<_>>(), vec![1, 2, 3, 4]);
        assert!(!p.is_free(0));
    }

    #[test]
    fn touching_a_free_block_removes_it_lazily_from_the_lru() {
        let mut p = BlockPool::new(5);
        assert!(p.touch(3));
        assert!(!p.touch(3));
        assert_eq!(p.ref_count(3), 2);
        assert_eq!(p.free_ids().collect::<Vec<_>>(), vec![1, 2, 4]);
        assert!(!p.unref(3));
        assert!(p.unref(3));
        p.push_free_back(3);
        assert_eq!(p.free_ids().collect::<Vec<_>>(), vec![1, 2, 4, 3]);
    }

    #[test]
    #[should_panic(expected = "double free")]
    fn unreferencing_a_free_block_panics() {
        let mut p = BlockPool::new(3);
        p.unref(1);
    }
}
