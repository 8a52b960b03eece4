"""MAX's own Llama pipeline (max.pipelines, architecture llama3) on a tiny 2-layer Llama
checkpoint (reference/ make-tiny) at float32 on the CPU, with max.nn.hooks.PrintHook naming
the model's layers and every print written as a .max file. Run with the MAX venv's python:
`pipeline.py MODEL_DIR PROMPT OUTDIR`; writes OUTDIR/max/*.max and OUTDIR/tensor_names.txt.

MAX runs the model in a spawned worker process, which imports this file again (not as
`__main__`): the hook and the print options are installed at import, from the environment,
so that they apply in the worker."""

import os
import sys

OUT_VAR = "LOUPE_MAX_PIPELINE_OUT"


def _install(out):
    from max.engine import InferenceSession

    session_init = InferenceSession.__init__

    def init(self, *a, **k):
        session_init(self, *a, **k)
        self.set_debug_print_options("BINARY_MAX_CHECKPOINT", 6, os.path.join(out, "max"))

    InferenceSession.__init__ = init
    from max.nn.hooks import PrintHook

    # The hook writes export_path/<step>/tensor_names.txt but creates no folder.
    os.makedirs(os.path.join(out, "export", "0"), exist_ok=True)
    hook = PrintHook(export_path=os.path.join(out, "export"))
    from max.pipelines.architectures.llama3 import llama3 as L

    llama_init = L.Llama3.__init__

    def named(self, *a, **k):
        llama_init(self, *a, **k)
        hook.name_layers(self)

    L.Llama3.__init__ = named
    return hook


if os.environ.get(OUT_VAR) and __name__ != "__main__":
    _HOOK = _install(os.environ[OUT_VAR])


def main():
    model_dir, prompt, out = sys.argv[1], sys.argv[2], sys.argv[3]
    os.environ.update({"HF_HUB_OFFLINE": "1", "OTEL_SDK_DISABLED": "true", "MAX_SERVE_DISABLE_TELEMETRY": "1"})
    os.environ[OUT_VAR] = os.path.abspath(out)
    _install(os.path.abspath(out))
    from max._entrypoints.llm import LLM
    from max.driver import DeviceSpec
    from max.pipelines.lib import PipelineArgs

    args = PipelineArgs.from_flat_kwargs(
        model_path=model_dir,
        quantization_encoding="float32",
        device_specs=[DeviceSpec.cpu()],
        max_length=64,
        max_batch_size=1,
    )
    llm = LLM(args)
    print("generated:", llm.generate([prompt], max_new_tokens=1), flush=True)
    # The LLM helper leaves its model worker running (and holding our stderr); end it, then
    # leave without the interpreter's shutdown, which waits on that worker's threads.
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()
        child.join(10)
    os._exit(0)


if __name__ == "__main__":
    main()
