//! Operator actions on a running batched engine (the server's `POST /reset_prefix_cache`).

use super::BatchEngine;

impl BatchEngine<'_> {
    /// Empties the prefix cache of the blocks no sequence holds
    /// ([`super::BlockManager::reset_prefix_cache`]), and deletes the disk tier's files
    /// (a cold cache is what an outside benchmark resets for); returns how many blocks it
    /// dropped from memory. Running sequences keep theirs and their answers do not change.
    pub fn reset_prefix_cache(&mut self) -> usize {
        if let Some(disk) = self.disk.as_mut() {
            disk.clear();
        }
        self.blocks.reset_prefix_cache()
    }
}
