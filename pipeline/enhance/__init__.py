"""Face post-processing: the optional per-session ``sharpen`` stage (docs/sharpen.md).

A restorer network the user brings (a Real-ESRGAN compact net such as ``realesr-general-x4v3.pth``, loaded
with spandrel: :mod:`.weights`) runs in the render engine after the lip-sync model, on the mouth region of
the generated face only, and its output is blended into the paste with a feathered mouth mask
(:mod:`.stage`). What a session may ask for, and the refusals, are :mod:`.options` (no torch there).
:mod:`.ncnn_convert` turns the ncnn files Real-ESRGAN's compact nets also ship as into a state dict.
"""
