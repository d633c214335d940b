"""The `ampteach` command and what stands behind it: doctor, bench, roofline, data, site.

    $ ampteach doctor

cli (the command), doctor (what this machine can do), bench (textbook exercise E.6.1),
roofline_command and data_command (front ends of the lab's roofline and the data loader), command
(what the measuring commands share), website (the course as a static site). May import every layer.
"""
