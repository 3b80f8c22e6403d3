"""The sandbox contract, shared by the daemon, the restricted worker and the container runner.

Standard library only, and no module here imports another sandboxd module (the image build
copies this package next to the runner, ``/opt/sandboxd/sandboxd/protocol/``, where nothing
else of sandboxd exists; the runner imports it as ``sandboxd.protocol`` there too):

``wire``     the frame format of every channel between a sandbox and the daemon
``rules``    the import, workspace-path and output rules, enforced on both sides
``display``  what a display item is (MIME types, caps, IPython's repr conventions)
``limits``   the limits of one call: their names, units, defaults, bounds and how a sandbox
             applies them (rlimits)
"""
