"""MuseTalk 1.5 as a live lip-sync backend (``--backend musetalk``; needs the ``lipcast[musetalk]`` extra).

The model (``/work/shared/musetalk-spec.md``): whisper-tiny's 5 hidden states around each video frame
condition a Stable-Diffusion-1.x UNet at timestep 0 (one pass), whose 4x32x32 latent the SD VAE decodes to a
256x256 face that is blended into the avatar frame under the lower-face mask.

Modules:

* :mod:`.config` -- the published configurations (UNet, VAE, whisper) and the checks of a user's files.
* :mod:`.weights` -- the weights directory's layout, loading into diffusers' and transformers' classes.
* :mod:`.mel` -- whisper's log-mel (streaming columns, the floor and scale).
* :mod:`.features` -- encoder hidden states, the per-frame window, the positional encoding; offline
  features of a whole recording (the reference's rules).
* :mod:`.featurizer` -- live features per session (context, placement, lookahead, floor policy).
* :mod:`.faces` -- the face box, the 256x256 crop, the masked/reference latent pair and the jaw mask.
* :mod:`.cache` -- the per-avatar cache that ``lipcast avatar prepare --backend musetalk`` writes.
* :mod:`.decode` -- the VAE decoder run only on the rows the blend mask uses.
* :mod:`.backend` -- the :class:`~lipcast.pipeline.backend.LipSyncBackend` (batching, CUDA graphs, paste).
* :mod:`.deviation` -- streaming versus offline features (``lipcast musetalk deviation``).
"""
