"""ms-swift's trainer made heterogeneous: pass this file to `swift sft --external_plugins recipes/swift_plugin.py`.

ms-swift imports each `--external_plugins` file before it builds the trainer; its TrainerFactory then
looks the class up by name in `swift.trainers`, so rebinding the name there is the one line.
`engine_loss=True`: ms-swift's `compute_loss` is the standard token cross-entropy under its defaults
(no loss_scale, dft, channel or auxiliary loss); ds_hetero's engine computes that loss itself, and
ms-swift's `token_acc` comes from the engine's loss pass (docs/clients.md).
"""

import swift.trainers

import ds_hetero

swift.trainers.Seq2SeqTrainer = ds_hetero.hetero(swift.trainers.Seq2SeqTrainer, engine_loss=True)
