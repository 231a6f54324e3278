"""Advice: the study in words (finding), the loss table (losses), the ranked changes
(ranked_advice), what a diagnosis calls for and its predictions (candidates: the list the finding
and ``workbench tune`` share), one run's diagnosis and the model's inputs (diagnosis), all a tune
takes from its base run in one call (base_plan). The analysis's top floor:
imports every floor below it."""
