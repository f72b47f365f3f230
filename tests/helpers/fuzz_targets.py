"""The services a fuzzer sends to (tests/helpers/fuzz_strategies.py makes the requests): a valid
request of every RPC made from real calls, sending a case to each service that serves its RPC,
and the health and memory of those services.

Used by tests/services/test_fuzz.py (the session's services, a small budget) and
bench/fuzz_services.py (10,000 requests). Checkpoint paths the fuzzer may use all lie
under `workdir`, except one that no process can create (/proc).
"""
from __future__ import annotations

import os

import grpc
import psutil
import torch
from fuzz_strategies import Case, Rpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tandem.data import codec
from tandem.data.batch import DataProto
from tandem.v1 import actor_pb2, common_pb2, critic_pb2, reward_pb2, rollout_pb2, weights_pb2

# clear answers to a bad request; OK for a request that happens to be valid
ALLOWED = frozenset({"OK", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "NOT_FOUND"})
# the weight plane answers ABORTED to a version that an update replaced meanwhile (a race the
# receiver resolves by syncing again: tandem/weights/source.py), which fuzzed updates provoke
VERSIONED = frozenset({"ActorService.StreamWeights", "ActorService.ShareWeights", "ActorService.ReleaseWeights",
                       "ActorService.BroadcastWeights"})


def allowed(code: str, rpc: Rpc) -> bool:
    return code in ALLOWED or (code == "ABORTED" and rpc.name in VERSIONED)
SERVED_BY = {"tandem.v1.ActorService": ("actor",), "tandem.v1.RolloutService": ("actor", "rollout"),
             "tandem.v1.CriticService": ("critic",), "tandem.v1.RewardService": ("reward",)}
SEQ_KEYS = ["input_ids", "attention_mask", "responses", "response_mask"]
PROMPTS = ["12+7=", "905+88=", "3+4=", "640+521="]
MAX_MESSAGE = 512 * 1024 * 1024


class Targets:
    def __init__(self, endpoints: dict[str, str], pids: dict[str, int], tokenizer, vocab_size: int, workdir: str,
                 timeout_s: float = 120):
        self.endpoints, self.pids, self.tokenizer, self.vocab = endpoints, pids, tokenizer, vocab_size
        self.workdir, self.timeout_s = workdir, timeout_s
        opts = [("grpc.max_send_message_length", MAX_MESSAGE), ("grpc.max_receive_message_length", MAX_MESSAGE)]
        self.channels = {role: grpc.insecure_channel(ep, options=opts) for role, ep in endpoints.items()}

    def close(self) -> None:
        for ch in self.channels.values():
            ch.close()

    # ---- sending --------------------------------------------------------------------------

    def send(self, case: Case, role: str) -> tuple[str, str]:
        """-> (status code name, details) of `case` sent as raw bytes to `role`'s service (a
        server stream is read to its end)."""
        kind = self.channels[role].unary_stream if case.rpc.streaming else self.channels[role].unary_unary
        call = kind(case.rpc.path, request_serializer=None, response_deserializer=None)
        try:
            answer = call(case.payload, timeout=self.timeout_s)
            if case.rpc.streaming:
                for _ in answer:
                    pass
            return "OK", ""
        except grpc.RpcError as e:
            return e.code().name, e.details() or ""

    def _call(self, role: str, rpc: str, request, response_cls):
        call = self.channels[role].unary_unary(rpc, request_serializer=lambda m: m.SerializeToString(),
                                               response_deserializer=response_cls.FromString)
        return call(request, timeout=self.timeout_s)

    # ---- valid requests ---------------------------------------------------------------------

    def seeds(self) -> dict[str, object]:
        """Rpc.name -> a valid request, built from the services' own answers."""
        tok = self.tokenizer
        rows = [[tok.bos_token_id] + tok(t, add_special_tokens=False)["input_ids"] for t in PROMPTS]
        width = max(map(len, rows))
        ids = torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in rows])
        prompts = DataProto(tensors={"input_ids": ids, "attention_mask": (ids != tok.pad_token_id).long()})
        sampling = rollout_pb2.SamplingParams(max_new_tokens=6, n=2, temperature=0.7, top_p=0.9, top_k=5, seed=3)
        generate = rollout_pb2.GenerateSequencesRequest(batch=codec.encode_batch(prompts), sampling=sampling)
        gen = codec.decode_batch(self._call("actor", "/tandem.v1.RolloutService/GenerateSequences", generate,
                                            rollout_pb2.GenerateSequencesResponse).batch)
        seq = gen.select(tensor_keys=SEQ_KEYS)
        seq.meta = {"temperature": 0.7, "rollout_n": 2}
        pb_seq = codec.encode_batch(seq)
        rows = actor_pb2.Rows(batch=pb_seq)
        old = codec.decode_batch(self._call("actor", "/tandem.v1.ActorService/ComputeLogProb",
                                            actor_pb2.ComputeLogProbRequest(rows=rows),
                                            actor_pb2.ComputeLogProbResponse).batch)["old_log_probs"]
        gen_adv = torch.randn(old.shape, generator=torch.Generator().manual_seed(0))
        update = DataProto(tensors={"old_log_probs": old, "advantages": gen_adv})
        critic = DataProto(tensors={**seq.tensors, "values": torch.zeros_like(old), "returns": gen_adv},
                           meta=seq.meta)
        sft = DataProto(tensors={"input_ids": seq["input_ids"], "attention_mask": seq["attention_mask"],
                                 "loss_mask": torch.cat([torch.zeros_like(ids).repeat_interleave(2, 0),
                                                         seq["response_mask"].long()], 1)})
        version = self.weights_version()
        score = DataProto(columns={"response_text": ["19", "993", "7", "x"], "ground_truth": ["19", "993", "8", "1"],
                                   "data_source": ["tandem/arithmetic"] * 4})
        ckpt = self.checkpoints()
        self.checkpoints("pristine")
        return {
            "ActorService.ComputeLogProb": actor_pb2.ComputeLogProbRequest(rows=rows, calculate_entropy=True,
                                                                           with_reference=True, before_update=True),
            "ActorService.UpdateActor": actor_pb2.UpdateActorRequest(rows=rows, batch=codec.encode_batch(update)),
            "ActorService.TrainSft": actor_pb2.TrainSftRequest(batch=codec.encode_batch(sft)),
            "ActorService.SetReference": actor_pb2.SetReferenceRequest(),
            "ActorService.GetWeightsManifest": weights_pb2.GetWeightsManifestRequest(),
            "ActorService.StreamWeights": weights_pb2.StreamWeightsRequest(weights_version=version,
                                                                           chunk_bytes=1 << 16),
            "ActorService.ShareWeights": weights_pb2.ShareWeightsRequest(weights_version=version),
            "ActorService.ReleaseWeights": weights_pb2.ReleaseWeightsRequest(weights_version=version),
            "ActorService.BroadcastWeights": weights_pb2.BroadcastWeightsRequest(
                group_id="fuzz", weights_version=version, bucket_bytes=1 << 20),
            "ActorService.SaveCheckpoint": common_pb2.SaveCheckpointRequest(path=os.path.join(self.workdir, "save")),
            "ActorService.LoadCheckpoint": common_pb2.LoadCheckpointRequest(path=ckpt["actor"]),
            "RolloutService.GenerateSequences": generate,
            "RolloutService.GetWeightsDigest": rollout_pb2.GetWeightsDigestRequest(),
            "CriticService.ComputeValues": critic_pb2.ComputeValuesRequest(batch=pb_seq),
            "CriticService.UpdateCritic": critic_pb2.UpdateCriticRequest(batch=codec.encode_batch(critic)),
            "CriticService.SaveCheckpoint": common_pb2.SaveCheckpointRequest(path=os.path.join(self.workdir, "csave")),
            "CriticService.LoadCheckpoint": common_pb2.LoadCheckpointRequest(path=ckpt["critic"]),
            "RewardService.Score": reward_pb2.ScoreRequest(batch=codec.encode_batch(score)),
        }

    def checkpoints(self, name: str = "ckpt") -> dict[str, str]:
        """Checkpoints of the actor and critic as they are now, under workdir/<name>_<role>
        ("ckpt": the fuzzer loads and may overwrite them; "pristine": what `restore` loads)."""
        out = {}
        for role, rpc in (("actor", "/tandem.v1.ActorService/SaveCheckpoint"),
                          ("critic", "/tandem.v1.CriticService/SaveCheckpoint")):
            path = os.path.join(self.workdir, f"{name}_{role}")
            if not os.path.isdir(path):
                self._call(role, rpc, common_pb2.SaveCheckpointRequest(path=path), common_pb2.SaveCheckpointResponse)
            out[role] = path
        return out

    def restore(self, seeds: dict[str, object]) -> None:
        """Actor and critic back to their state when `seeds` was made (the pristine checkpoints,
        which no fuzzed path names); the standalone rollout back to the actor's weights then."""
        for role, service in (("actor", "ActorService"), ("critic", "CriticService")):
            path = self.checkpoints("pristine")[role]
            self._call(role, f"/tandem.v1.{service}/LoadCheckpoint", common_pb2.LoadCheckpointRequest(path=path),
                       common_pb2.LoadCheckpointResponse)
        if "rollout" in self.channels:
            self._call("rollout", "/tandem.v1.RolloutService/SyncWeights",
                       rollout_pb2.SyncWeightsRequest(weights_version=self.weights_version(),
                                                      source=self.endpoints["actor"], force=True),
                       rollout_pb2.SyncWeightsResponse)

    def weights_version(self) -> int:
        """The actor's current weights version (its weight source's manifest)."""
        return self._call("actor", "/tandem.v1.ActorService/GetWeightsManifest",
                          weights_pb2.GetWeightsManifestRequest(),
                          weights_pb2.GetWeightsManifestResponse).manifest.weights_version

    def paths(self) -> list[str]:
        """Checkpoint paths for SaveCheckpoint / LoadCheckpoint: odd ones, all under workdir."""
        a_file = os.path.join(self.workdir, "a_file")
        open(a_file, "w").close()
        ckpt = self.checkpoints()
        return ["", "\x00", "relative/dir", os.path.join(self.workdir, "a" * 300), a_file,
                os.path.join(a_file, "sub"), "/proc/tandem_fuzz/ckpt", os.path.join(self.workdir, "new"),
                os.path.join(self.workdir, "missing", "deeper"), ckpt["actor"], ckpt["critic"], self.workdir,
                ckpt["actor"] + "/../ckpt_critic"]

    # ---- health and memory ------------------------------------------------------------------

    def healthy(self) -> dict[str, bool]:
        out = {}
        for role, ch in self.channels.items():
            try:
                resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=30)
                out[role] = resp.status == health_pb2.HealthCheckResponse.SERVING
            except grpc.RpcError:
                out[role] = False
        return out

    def alive(self) -> dict[str, bool]:
        return {role: psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                for role, pid in self.pids.items()}

    def rss_mib(self) -> dict[str, float]:
        """Resident memory of each service, all its ranks (the process and its children), MiB."""
        out = {}
        for role, pid in self.pids.items():
            try:
                p = psutil.Process(pid)
                out[role] = sum(q.memory_info().rss for q in [p, *p.children(recursive=True)]) / 2**20
            except psutil.NoSuchProcess:
                out[role] = float("nan")
        return out


def roles_for(rpc: Rpc, targets: Targets) -> list[str]:
    return [r for r in SERVED_BY[rpc.service] if r in targets.channels]
