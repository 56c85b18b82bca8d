"""The GPUs of the load generator's host through NVML (nvidia-ml-py), the common case of a
server under test on the same machine: utilisation, memory, power and the energy counter of
each GPU, as families of a scrape whose source is "nvml" (records/engine_maps.py reads them).
Any NVML error leaves that figure out of the scrape (unknown), never fails the run."""

from __future__ import annotations

import time

from records.server_metrics import NVML, Family, Sample, Scrape

# family -> (type, help); every sample is labelled by the GPU's index
FAMILIES = {
    "nvml_gpu_utilization_ratio": ("gauge", "GPU busy share over NVML's last sample period"),
    "nvml_gpu_memory_used_bytes": ("gauge", "GPU memory in use, every process"),
    "nvml_gpu_power_watts": ("gauge", "GPU power draw"),
    "nvml_gpu_energy_joules": ("counter", "GPU energy since the driver loaded"),
}


class Nvml:
    def __init__(self):
        """Opens NVML; `problem` says in one line why there is no GPU to read ("" if there
        is)."""
        self.handles: list = []
        self.problem = ""
        try:
            import pynvml
            pynvml.nvmlInit()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                            for i in range(pynvml.nvmlDeviceGetCount())]
            self.nvml = pynvml
        except Exception as e:  # no library, no driver, no device: all mean the same here
            self.problem = f"no GPU visible to NVML ({type(e).__name__})"
            return
        if not self.handles:
            self.problem = "no GPU visible to NVML (0 devices)"

    @staticmethod
    def absent() -> str:
        """Why this host has no GPU to read ("" where it has one), NVML shut again: whether a
        run needs the collector at all."""
        gpu = Nvml()
        if not gpu.problem:
            gpu.nvml.nvmlShutdown()
        return gpu.problem

    def readings(self, handle) -> dict[str, float]:
        nvml, out = self.nvml, {}
        reads = {
            "nvml_gpu_utilization_ratio":
                lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100,
            "nvml_gpu_memory_used_bytes": lambda: nvml.nvmlDeviceGetMemoryInfo(handle).used,
            "nvml_gpu_power_watts": lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1e3,
            "nvml_gpu_energy_joules":
                lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1e3,
        }
        for name, read in reads.items():
            try:
                out[name] = float(read())
            except Exception:  # not supported on this GPU, or a transient NVML error
                pass
        return out

    def scrape(self, started_unix_s: float) -> Scrape:
        t_unix_s, t0 = time.time(), time.monotonic()
        samples: dict[str, list[Sample]] = {name: [] for name in FAMILIES}
        for index, handle in enumerate(self.handles):
            for name, value in self.readings(handle).items():
                suffix = "_total" if FAMILIES[name][0] == "counter" else ""
                samples[name].append(Sample(name=name + suffix, labels={"gpu": str(index)},
                                            value=value))
        families = [Family(name=name, type=kind, help=help, samples=samples[name])
                    for name, (kind, help) in FAMILIES.items() if samples[name]]
        return Scrape(t_unix_s=t_unix_s, t_run_s=t_unix_s - started_unix_s, source=NVML,
                      ok=bool(families), error="" if families else "every NVML reading failed",
                      elapsed_ms=(time.monotonic() - t0) * 1e3, families=families)
