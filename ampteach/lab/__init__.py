"""What the lessons measure and draw: one module per phenomenon, each with its figure.

    from ampteach.lab.underflow import zone_fractions, plot_gradient_histogram

Measurements (underflow, lost_updates, memory, step_time, roofline, nan_spread, dtype_flow), the
recipes lessons 5 and 6 take apart (grad_accumulation, clipping, distributed), torch.amp beside
ampteach (compare_torch, side_by_side), and drawing (plots, widgets, fp8_plots, scale_logs).
Imports ampteach.training and ampteach.amp.
"""
