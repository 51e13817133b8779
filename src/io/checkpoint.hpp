#pragma once
// Full checkpoints in place (checkpoint.cpp): what Model::save writes, with extra entries in its
// mpt_state, and their restore into an existing model (BackupAndRestore).
#include <string>

#include "core/json_util.hpp"
#include "mpt/model.hpp"

namespace mpt::io {

/// Model::save(filepath) with extra_state's entries added to the saved mpt_state.
void save_checkpoint(const Model& model, const std::string& filepath, const Json& extra_state);
/// Restores a file save_checkpoint (or Model::save) wrote into `model`, which must have the
/// same layers: weights, the optimizer's state when compiled (required then), loss scale,
/// epoch and random state, all checked before any is applied. Returns the file's mpt_state.
Json restore_checkpoint(Model& model, const std::string& filepath);

}  // namespace mpt::io
