"""The BPU model and the compile step: what runs where on the X5 BPU, and how it becomes a `.bin`.

``optable``: the X5 BPU operator table (op type -> BPU type name, active or
    passive quantization, BPU unit, constraints): the single source of truth
    the checker, makertbin and hb_perf read;
``placement``: BPU/CPU placement of a float model's nodes (the checker's table);
``partition``: a QDQ quantized model cut into BPU subgraphs and CPU ops (the plan);
``compile``: makertbin's compile stage around the partitioner (input_batch,
    layer_out_dump, the O3 compile cache);
``plan``: a compiled model's execution plan read as a dataflow graph (tensors,
    producers, consumers, the ONNX pieces), for the tools and node removal;
``modifier``: removing nodes at a compiled model's inputs and outputs
    (hb_model_modifier, and makertbin's remove_node_type / remove_node_name);
``timing``: the X5 timing model: its parameter table, per-layer and per-step
    costs, and the compile step storing each step's modeled time in the `.bin`
    (makertbin's estimate line; hb_perf, bpuemu.host.tools.static_perf, reports it).
"""
