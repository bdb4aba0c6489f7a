"""A run folder on disk: its layout and checkpoint names (:mod:`.folder`), atomic writes, the
safetensors reader and the run lock (:mod:`.io`), the weights a folder means (:mod:`.weights`), and
Hydra's record of a job in it (:mod:`.hydra_record`)."""
