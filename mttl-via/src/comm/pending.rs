//! The pending-VI list of MTTL over VIA: VIs whose receive completed (seen
//! on the shared completion queue) but was not consumed yet, in arrival
//! order. `brecany` takes the head; `brecnode` and `prob` append the
//! completions for other nodes they meet to the tail.
//!
//! One entry per completion (a VI with three completed receives is on the
//! list three times), in a doubly linked list over a slab of entries, so
//! that unlinking from the middle (`brecnode`) is O(1) once found.

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Entry {
    node: u32,
    prev: u32,
    next: u32,
}

/// Completed-but-unconsumed receives, oldest first.
#[derive(Default)]
pub struct PendingList {
    slab: Vec<Entry>,
    free: Vec<u32>,
    head: Option<u32>,
    tail: Option<u32>,
    len: usize,
}

impl PendingList {
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Appends a completion of `node`'s VI at the tail.
    pub fn push_back(&mut self, node: usize) {
        let e = Entry { node: node as u32, prev: self.tail.unwrap_or(NIL), next: NIL };
        let i = match self.free.pop() {
            Some(i) => {
                self.slab[i as usize] = e;
                i
            }
            None => {
                self.slab.push(e);
                (self.slab.len() - 1) as u32
            }
        };
        match self.tail {
            Some(t) => self.slab[t as usize].next = i,
            None => self.head = Some(i),
        }
        self.tail = Some(i);
        self.len += 1;
    }

    /// The node at the head.
    pub fn front(&self) -> Option<usize> {
        self.head.map(|h| self.slab[h as usize].node as usize)
    }

    /// Takes the head entry.
    pub fn pop_front(&mut self) -> Option<usize> {
        let h = self.head?;
        Some(self.unlink(h))
    }

    /// Takes the oldest entry of `node`, if it is on the list.
    pub fn take(&mut self, node: usize) -> bool {
        let mut i = self.head;
        while let Some(k) = i {
            let e = self.slab[k as usize];
            if e.node as usize == node {
                self.unlink(k);
                return true;
            }
            i = (e.next != NIL).then_some(e.next);
        }
        false
    }

    fn unlink(&mut self, k: u32) -> usize {
        let e = self.slab[k as usize];
        match e.prev {
            NIL => self.head = (e.next != NIL).then_some(e.next),
            p => self.slab[p as usize].next = e.next,
        }
        match e.next {
            NIL => self.tail = (e.prev != NIL).then_some(e.prev),
            n => self.slab[n as usize].prev = e.prev,
        }
        self.free.push(k);
        self.len -= 1;
        e.node as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_arrival_order_and_unlinks_from_the_middle() {
        let mut p = PendingList::default();
        for n in [3, 1, 3, 2, 1] {
            p.push_back(n);
        }
        assert_eq!(p.front(), Some(3));
        assert!(p.take(2));
        assert!(!p.take(7));
        assert!(p.take(1));
        assert_eq!(p.len(), 3);
        assert_eq!(p.pop_front(), Some(3));
        assert_eq!(p.pop_front(), Some(3));
        p.push_back(4);
        assert_eq!(p.pop_front(), Some(1));
        assert_eq!(p.pop_front(), Some(4));
        assert!(p.is_empty());
        assert_eq!(p.pop_front(), None);
    }
}
