"""A minor number NVML gives two cards must not hand one card's device node to the other's pods.

Found by experiment (helper audit, session 13): a card whose minor number read as another card's
(an answer NVML should not give: /dev/nvidia<minor> is one card's node) was advertised with it, and
a pod given that card got the OTHER card's /dev/nvidia<minor> in its container (a card it was not
given), while its own node was never mounted. The minor of the card read later is now unknown (no
device node is named for it; the NVIDIA runtime still mounts what NVIDIA_VISIBLE_DEVICES names);
the first card keeps it, as for a UUID two cards read as.
"""
from __future__ import annotations

from dp_harness import bind_pod, container, record, rig
from fakenvml import default_cards

from stowage.resources import RESOURCE_GPU


def test_a_minor_another_card_has_is_not_handed_to_a_pod_of_this_card(monkeypatch):
    cards = default_cards()
    cards[2].minor = 0              # card 2 reads as card 0's device node
    with rig(monkeypatch, cards=cards) as r:
        assert r.registered()
        u0, u2 = r.uuid(0), r.uuid(2)
        p2 = bind_pod(r, "on-two", [container("main", gpus=1)],
                      record([(2, u2)], whole=True, mem_mib=23028, core_milli=1000), "2024-01-01T00:00:01Z")
        resp = r.kubelet.admit(p2)["main"][RESOURCE_GPU]
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == u2
        assert sorted(d.container_path for d in resp.devices) == ["/dev/nvidiactl"]
        p0 = bind_pod(r, "on-zero", [container("main", gpus=1)],
                      record([(0, u0)], whole=True, mem_mib=81920, core_milli=1000), "2024-01-01T00:00:02Z")
        resp = r.kubelet.admit(p0)["main"][RESOURCE_GPU]   # the first card keeps its node
        assert sorted(d.container_path for d in resp.devices) == ["/dev/nvidia0", "/dev/nvidiactl"]
