//! The key/value cache: per attention layer, one row per position of
//! `n_kv_heads * head_dim` keys (after RoPE) and as many values.

use crate::GraphError;

#[derive(Debug, Clone)]
pub struct KvCache {
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    width: usize,
    len: usize,
    capacity: usize,
}

impl KvCache {
    /// A cache for `layers` layers of rows `width` wide, holding up to `capacity`
    /// positions. Memory grows with use up to the capacity.
    pub fn new(layers: usize, width: usize, capacity: usize) -> KvCache {
        KvCache { keys: vec![Vec::new(); layers], values: vec![Vec::new(); layers], width, len: 0, capacity }
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
        for buf in self.keys.iter_mut().chain(self.values.iter_mut()) {
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

    /// Marks `tokens` positions as written by every layer.
    pub(crate) fn commit(&mut self, tokens: usize) {
        self.len += tokens;
    }

    /// The cached keys and values of one layer (for taps and tests).
    pub fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        (&self.keys[layer][..self.len * self.width], &self.values[layer][..self.len * self.width])
    }
}
