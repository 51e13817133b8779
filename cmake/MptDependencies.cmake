# Finds every dependency of mpt; all come from Debian packages (scripts/install_deps.sh).
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED)
find_package(xtensor REQUIRED)
find_package(nlohmann_json REQUIRED)  # JSON of checkpoint configs; public: Layer::config() returns nlohmann::json
find_package(dnnl REQUIRED)  # Debian's config also wants OpenCL (ocl-icd-opencl-dev)
find_package(HDF5 REQUIRED COMPONENTS C)
find_package(ZLIB REQUIRED)
# Optional: the .keras (zip) checkpoint format. Found by hand: Debian's libzip CMake config
# insists on the zipcmp/zipmerge/ziptool programs, which libzip-dev does not install.
find_path(MPT_LIBZIP_INCLUDE_DIR zip.h)
find_library(MPT_LIBZIP_LIBRARY zip)
if(MPT_LIBZIP_INCLUDE_DIR AND MPT_LIBZIP_LIBRARY AND NOT TARGET mpt_libzip)
  add_library(mpt_libzip INTERFACE)
  target_include_directories(mpt_libzip INTERFACE ${MPT_LIBZIP_INCLUDE_DIR})
  target_link_libraries(mpt_libzip INTERFACE ${MPT_LIBZIP_LIBRARY})
endif()

if(NOT TARGET hdf5::hdf5)
  add_library(hdf5::hdf5 INTERFACE IMPORTED)
  target_include_directories(hdf5::hdf5 INTERFACE ${HDF5_C_INCLUDE_DIRS} ${HDF5_INCLUDE_DIRS})
  target_link_libraries(hdf5::hdf5 INTERFACE ${HDF5_C_LIBRARIES})
endif()

if(MPT_WITH_CUDA)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)
  endif()
  enable_language(CUDA)
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)  # CMake < 3.26 does not know nvcc's C++20 flag
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  find_package(CUDAToolkit REQUIRED)
  find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_library(CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64 /usr/local/cuda/lib)
  if(NOT CUDNN_INCLUDE_DIR OR NOT CUDNN_LIBRARY)
    message(FATAL_ERROR "MPT_WITH_CUDA: cuDNN 9 not found (cudnn.h / libcudnn.so); set CUDNN_INCLUDE_DIR and CUDNN_LIBRARY or -DMPT_WITH_CUDA=OFF")
  endif()
  add_library(mpt_cudnn INTERFACE)
  target_include_directories(mpt_cudnn INTERFACE ${CUDNN_INCLUDE_DIR})
  target_link_libraries(mpt_cudnn INTERFACE ${CUDNN_LIBRARY})
  message(STATUS "mpt: CUDA backend ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, archs ${CMAKE_CUDA_ARCHITECTURES}, cuDNN ${CUDNN_LIBRARY})")
else()
  message(STATUS "mpt: CUDA backend OFF")
endif()

# TensorBoard event files: the Event/Summary protocol buffers (src/model/tensorboard/event.proto),
# compiled by protoc (Debian: libprotobuf-dev protobuf-compiler).
find_package(Protobuf REQUIRED)
