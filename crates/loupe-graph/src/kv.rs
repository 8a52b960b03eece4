//! The key/value cache: per attention layer, one row per position of
//! `n_kv_heads * head_dim` keys (after RoPE) and as many values.

use crate::GraphError;

/// How an attention node writes its keys into the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvWrite {
    /// Row `p` holds the key of position `p`.
    #[default]
    InPlace,
    /// Row `p` holds the key of position `p - 1`, row 0 zeros: an off-by-one in the cache
    /// write (a planted fault, [`crate::FaultClass::KvWrite`]). Values are written in place.
    OneLate,
}

#[derive(Debug, Clone)]
pub struct KvCache {
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    /// Per layer, the true keys of every position, kept only for layers written
    /// [`KvWrite::OneLate`] (empty, unallocated, for every other layer): the key of the last
    /// position of one call is needed in the next call's first row.
    true_keys: Vec<Vec<f32>>,
    width: usize,
    len: usize,
    capacity: usize,
}

impl KvCache {
    /// A cache for `layers` layers of rows `width` wide, holding up to `capacity`
    /// positions. Memory grows with use up to the capacity.
    pub fn new(layers: usize, width: usize, capacity: usize) -> KvCache {
        KvCache { keys: vec![Vec::new(); layers], values: vec![Vec::new(); layers], true_keys: vec![Vec::new(); layers], width, len: 0, capacity }
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Reserves room for `positions` positions in every layer up front (so decode does not
    /// reallocate).
    pub fn reserve(&mut self, positions: usize) {
        let n = positions.min(self.capacity) * self.width;
        for buf in self.keys.iter_mut().chain(self.values.iter_mut()) {
            buf.reserve(n.saturating_sub(buf.len()));
        }
    }

    /// Forgets positions from `len` on (to rewind or restart a sequence).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        for buf in self.keys.iter_mut().chain(self.values.iter_mut()).chain(self.true_keys.iter_mut()) {
            buf.truncate(self.len * self.width);
        }
    }

    /// Checks that `tokens` more positions fit.
    pub fn check_room(&self, tokens: usize) -> Result<(), GraphError> {
        let needed = self.len + tokens;
        if needed > self.capacity {
            return Err(GraphError::ContextOverflow { needed, capacity: self.capacity });
        }
        Ok(())
    }

    /// Appends this call's keys and values for `layer` (rows `len..len+tokens`) and
    /// returns the whole cached keys and values of that layer.
    pub(crate) fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> (&[f32], &[f32]) {
        let keys = &mut self.keys[layer];
        keys.truncate(self.len * self.width);
        keys.extend_from_slice(k);
        let values = &mut self.values[layer];
        values.truncate(self.len * self.width);
        values.extend_from_slice(v);
        (&self.keys[layer], &self.values[layer])
    }

    /// [`KvCache::append`] with keys one position late ([`KvWrite::OneLate`]).
    pub(crate) fn append_late(&mut self, layer: usize, k: &[f32], v: &[f32]) -> (&[f32], &[f32]) {
        let w = self.width;
        let start = self.len * w;
        let truth = &mut self.true_keys[layer];
        truth.truncate(start);
        truth.extend_from_slice(k);
        let keys = &mut self.keys[layer];
        keys.truncate(start);
        let rows = k.len() / w.max(1);
        for p in self.len..self.len + rows {
            match p.checked_sub(1) {
                Some(prev) => keys.extend_from_slice(&truth[prev * w..(prev + 1) * w]),
                None => keys.resize(keys.len() + w, 0.0),
            }
        }
        let values = &mut self.values[layer];
        values.truncate(start);
        values.extend_from_slice(v);
        (&self.keys[layer], &self.values[layer])
    }

    /// Marks `tokens` positions as written by every layer.
    pub(crate) fn commit(&mut self, tokens: usize) {
        self.len += tokens;
    }

    /// The cached keys and values of one layer (for taps and tests).
    pub fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        (&self.keys[layer][..self.len * self.width], &self.values[layer][..self.len * self.width])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn late_write_shifts_keys_across_calls() {
        let mut kv = KvCache::new(1, 1, 8);
        let (k, v) = kv.append_late(0, &[1.0, 2.0, 3.0], &[10.0, 20.0, 30.0]);
        assert_eq!(k, &[0.0, 1.0, 2.0]);
        assert_eq!(v, &[10.0, 20.0, 30.0]);
        kv.commit(3);
        // the next call's first row holds the previous call's last key
        let (k, _) = kv.append_late(0, &[4.0], &[40.0]);
        assert_eq!(k, &[0.0, 1.0, 2.0, 3.0]);
        kv.commit(1);
        kv.truncate(2);
        let (k, _) = kv.append_late(0, &[5.0], &[50.0]);
        assert_eq!(k, &[0.0, 1.0, 2.0]);
    }
}
