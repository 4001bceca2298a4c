"""The only place that imports Kunlun vendor libraries (kunlun_ops, xspeedgate_ops,
torch_xmlir), always lazily, plus portable torch implementations of what we call."""
