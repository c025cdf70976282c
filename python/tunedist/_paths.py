"""Where the installed C++ side of tunedist lies, for building C++ code against it.

    p=$(python -c 'import tunedist, torch; print(tunedist.cmake_prefix_path + ";" + torch.utils.cmake_prefix_path)')
    cmake -DCMAKE_PREFIX_PATH="$p" ...

Then find_package(tunedist REQUIRED) and target_link_libraries(app PRIVATE tunedist::tunedist).
"""

import os

_package_dir = os.path.dirname(os.path.abspath(__file__))

# For CMAKE_PREFIX_PATH; it holds tunedist/tunedistConfig.cmake (as torch.utils.cmake_prefix_path holds Torch/).
cmake_prefix_path: str = os.path.join(_package_dir, "share", "cmake")

# For -I: holds tunedist/tunedist.h.
include_dir: str = os.path.join(_package_dir, "include")
