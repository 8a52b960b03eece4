//! Operator actions on a running batched engine (the server's `POST /reset_prefix_cache`).

use super::BatchEngine;

impl BatchEngine<'_> {
    /// Empties the prefix cache of the blocks no sequence holds
    /// ([`super::BlockManager::reset_prefix_cache`]); returns how many blocks it dropped.
    /// Running sequences keep theirs and their answers do not change.
    pub fn reset_prefix_cache(&mut self) -> usize {
        self.blocks.reset_prefix_cache()
    }
}
