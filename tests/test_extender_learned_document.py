"""The departed pods' document (extender/learned_past.py) read back as Stowage writes it, and
nothing else."""
from __future__ import annotations

import json

import pytest

from extender.learned_past import FIELDS, FORMAT, DepartedPods, PastError


def test_a_stored_model_list_not_written_as_stowage_writes_it_is_refused():
    """Found by experiment: a document holding ``["B", "A"]`` beside ``["A", "B"]`` (or ``["A", "A"]``
    beside ``["A"]``) was read as two shapes, though a pod of either list is one class: the check
    that refuses a shape written twice did not see it, and the rows were written back as read."""
    def doc(*lists):
        return json.dumps({"format": FORMAT, "fields": list(FIELDS),
                           "shapes": [[1, 0, 0, 0, 0, 0, models, 2] for models in lists]})
    assert list(DepartedPods.from_json(doc(["A", "B"], ["A"])).items())[0][1] == ("A", "B")
    for lists in ((["B", "A"], ["A", "B"]), (["A", "A"], ["A"]), (["B", "A"],)):
        with pytest.raises(PastError, match="models"):
            DepartedPods.from_json(doc(*lists))
