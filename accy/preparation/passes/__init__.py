"""The passes of the six stage pipelines, one module (or package) per stage.

Nothing is imported here: each stage's recipe (:mod:`accy.preparation.recipe`)
imports its own passes, and :func:`accy.pipeline.replay` loads every stage's
passes explicitly to replay a reproducer.
"""

